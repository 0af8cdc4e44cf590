"""The target answers prompts (specwise/lab/answers.py), the pipeline `specwise distill` and `specwise index` share:
their arguments and options, the requests gathered, the data directory's plan, resumable answering in chunks, the
cache of requests the target writes, and `specwise index` end to end on a tiny target."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from conftest import needs_hf
from specwise.lab import answers
from specwise.lab.answers import AnswerOptions, answer_in_chunks, answer_seed, check_plan, gather_prompts


def _write_prompts(directory, count: int):
    directory.mkdir()
    for name in ("oasst_en", "mbpp", "gsm8k_train"):
        rows = [{"prompt": f"Tell me about {name} number {i}.", "source": "test"} for i in range(count)]
        (directory / f"{name}.prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return directory


def _book(path, paragraphs: int = 60):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "\n\n".join(f"Paragraph {i} tells of a walk by the river and the weather." for i in range(paragraphs))
    )
    return path


# ------------------------------------------------------------------------------------------------- the commands


def test_distill_and_index_share_their_arguments_and_options():
    """Both commands take the shared arguments with their own defaults, and turn them into the same options."""
    from specwise.cli import build_parser

    parser = build_parser()
    shared = ["--target", "t", "--out", "o", "--prompts-dir", "p", "--data-dir", "d", "--gsm8k-limit", "5"]
    shared += ["--max-prompts", "7", "--corpus-dir", "c", "--passages", "3", "--self-prompts", "2", "--seed", "4"]
    shared += ["--device", "cpu", "--no-progress"]
    distill = answers.answer_options(parser.parse_args(["distill", *shared]))
    index = answers.answer_options(parser.parse_args(["index", *shared]))
    assert {k: v for k, v in distill.items() if k != "max_new_tokens"} == {
        k: v for k, v in index.items() if k != "max_new_tokens"
    }
    assert distill["prompt_limits"]["gsm8k_train.prompts.jsonl"] == 5 and distill["progress"] is False
    assert (distill["max_new_tokens"], index["max_new_tokens"]) == (192, 256)  # each command's own default
    from specwise.lab.distill import DistillOptions
    from specwise.lab.index import IndexOptions

    assert DistillOptions(**distill).passages == IndexOptions(**index).passages == 3
    assert IndexOptions().temperatures != DistillOptions().temperatures  # the subclasses keep their own defaults
    assert isinstance(IndexOptions(), AnswerOptions) and isinstance(DistillOptions(), AnswerOptions)


@pytest.mark.parametrize("command", ["distill", "index"])
@pytest.mark.parametrize(
    "extra, message",
    [
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["--passages", "-1"], "--passages must be >= 0"),
        (["--gsm8k-limit", "-2"], "--gsm8k-limit must be >= 0"),
    ],
)
def test_bad_shared_arguments_get_one_line(command, extra, message, capsys):
    from specwise.cli import main

    if command == "distill":  # its extra is checked first
        needs_hf()
    assert main([command, "--out", "x", "--prompts-dir", "p", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_command_may_only_reword_a_shared_argument():
    p = argparse.ArgumentParser()
    answers.add_arguments(p, out_help="where", max_new_tokens=9, data_dir="its own words")
    assert "its own words" in p.format_help() and "default: 9" in p.format_help()
    with pytest.raises(TypeError, match="no shared argument"):
        answers.add_arguments(argparse.ArgumentParser(), out_help="x", max_new_tokens=1, budget="y")


# ------------------------------------------------------------------------------------------------- the requests


def test_gather_prompts_is_seeded_and_checks_its_sources(tmp_path):
    prompts = _write_prompts(tmp_path / "prompts", 6)
    book = _book(tmp_path / "corpus" / "book.txt")
    opts = AnswerOptions(prompts_dir=prompts, corpus_dir=book.parent, passages=2, seed=1)
    opts.prompt_limits["gsm8k_train.prompts.jsonl"] = 3
    texts, tasks = gather_prompts(opts)
    assert (texts, tasks) == gather_prompts(opts)
    assert len(texts) == 6 + 6 + 3 and len(tasks) == 2
    assert sum("gsm8k_train" in t for t in texts) == 3
    assert (
        gather_prompts(AnswerOptions(prompts_dir=prompts, seed=2))[0]
        != gather_prompts(AnswerOptions(prompts_dir=prompts, seed=1))[0]
    )
    assert gather_prompts(AnswerOptions(prompts_dir=prompts))[1] == []  # no passages asked
    with pytest.raises(ValueError, match="no prompts directory"):
        gather_prompts(AnswerOptions())
    with pytest.raises(ValueError, match="need a corpus"):
        gather_prompts(AnswerOptions(prompts_dir=prompts, passages=1))
    with pytest.raises(FileNotFoundError, match="--prompts-dir"):
        gather_prompts(AnswerOptions(prompts_dir=tmp_path / "nowhere"))


def test_the_request_cache_refuses_another_target_or_seed(tmp_path):
    path = tmp_path / "written.json"
    state = answers.request_cache(path, [1, 2], 0, "tries")
    assert state == {"prefix": [1, 2], "seed": 0, "tries": 0, "prompts": []}
    state["prompts"].append("a request")
    path.write_text(json.dumps(state))
    assert answers.request_cache(path, [1, 2], 0, "tries")["prompts"] == ["a request"]
    for prefix, seed in (([1, 3], 0), ([1, 2], 1)):
        with pytest.raises(ValueError, match="another target or seed"):
            answers.request_cache(path, prefix, seed, "tries")


def test_the_plan_is_recorded_and_another_refused_by_its_differences(tmp_path):
    check_plan(tmp_path, {"seed": 0, "chunk": 4})
    check_plan(tmp_path, {"seed": 0, "chunk": 4})  # the same plan resumes
    with pytest.raises(ValueError, match=r"other settings \(chunk, seed differ\)"):
        check_plan(tmp_path, {"seed": 1, "chunk": 5})
    assert json.loads((tmp_path / "manifest.json").read_text()) == {"seed": 0, "chunk": 4}


# -------------------------------------------------------------------------------------------------- the answers


class Target:
    """Answers a prompt with its temperature, seed and a closing token; counts its calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, prompt, temperature, seed):
        self.calls.append((prompt[0], temperature, seed))
        return [prompt[0], int(temperature * 10), seed, 99]


REQUESTS = [[i, i + 1] for i in range(10)]


def test_answers_come_in_resumable_chunks_with_each_requests_temperature_and_seed(tmp_path):
    target = Target()
    done = answer_in_chunks(REQUESTS, target, tmp_path, temperatures=(0.0, 0.5), seed=3, chunk=4, progress=False)
    assert [len(c) for c in done.chunks] == [4, 4, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"chunk_0000{c}.json" for c in range(3)]
    flat = [a for c in done.chunks for a in c]
    assert flat == [[j, 5 * (j % 2), answer_seed(3, j), 99] for j in range(10)]
    assert done.generated == done.this_run == 40
    again = Target()
    resumed = answer_in_chunks(REQUESTS, again, tmp_path, temperatures=(0.0, 0.5), seed=3, chunk=4, progress=False)
    assert again.calls == [] and resumed.chunks == done.chunks and (resumed.generated, resumed.this_run) == (40, 0)


def test_a_budget_cuts_a_chunk_and_a_larger_run_completes_it(tmp_path):
    cut = answer_in_chunks(REQUESTS, Target(), tmp_path, chunk=4, budget_tokens=18, progress=False)
    assert [len(c) for c in cut.chunks] == [4, 1]  # checked before each answer: 16 < 18, then 20
    assert json.loads((tmp_path / "chunk_00001.json").read_text())["answers"] == cut.chunks[1]
    more = Target()
    whole = answer_in_chunks(REQUESTS, more, tmp_path, chunk=4, progress=False)
    assert [j for j, _, _ in more.calls] == list(range(5, 10))
    assert [a for c in whole.chunks for a in c] == [[j, 0, answer_seed(0, j), 99] for j in range(10)]


def test_index_end_to_end_on_a_tiny_target_then_resumed(tmp_path, tiny_dir, capsys):
    """`specwise index` gathers prompts and passages, answers them through the engine into chunks, writes the index;
    a rerun answers nothing again and writes the same index."""
    from specwise.cli import main
    from specwise.drafters.suffix import load_index

    prompts = _write_prompts(tmp_path / "prompts", 3)
    _book(tmp_path / "corpus" / "book.txt")
    args = ["index", "--target", tiny_dir, "--out", str(tmp_path / "index"), "--prompts-dir", str(prompts)]
    args += ["--data-dir", str(tmp_path / "data"), "--corpus-dir", str(tmp_path / "corpus"), "--passages", "2"]
    args += ["--max-new-tokens", "4", "--no-progress"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["answers"] == 3 * 3 + 2 and first["generated_this_run"] > 0
    assert main(args) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["generated_this_run"] == 0 and second["generated_tokens"] == first["generated_tokens"]
    assert load_index(tmp_path / "index").info["build"]["requests"] == {"prompts": 9, "passages": 2}


def test_progress_without_tqdm_is_a_line_on_stderr(monkeypatch, capsys):
    """The core install has no tqdm: answering shows its progress as lines on stderr instead."""
    monkeypatch.setitem(sys.modules, "tqdm", None)
    bar = answers.progress_bar(3, "answering", "answer", progress=True)
    bar.update(2)
    bar.set_postfix(tokens=7)
    bar.close()
    assert capsys.readouterr().err == "answering: 2/3 answers (tokens=7)\n"
    quiet = answers.progress_bar(3, "answering", "answer", progress=False)
    quiet.update(1)
    quiet.close()
    assert capsys.readouterr().err == ""
