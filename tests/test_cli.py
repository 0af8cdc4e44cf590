"""The command line: JSON output, streaming, argument errors, vocabulary mismatch, and bad input (missing, damaged
and non-model files, bad flag values) reported in one line without a traceback unless asked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import tiny_llama
from specwise.cli import main

STATS_FIELDS = {
    "target_passes",
    "drafted",
    "accepted",
    "acceptance_rate",
    "mean_accepted_length",
    "acceptance_by_position",
    "tokens_per_second",
    "draft_seconds",
    "verify_seconds",
}


@pytest.fixture(scope="module")
def other_vocab_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-other")
    tiny_llama(seed=4, vocab=500, hidden=16, layers=1).save_pretrained(path)
    return str(path)


def run_json(capsys, *args):
    code = main(["generate", *args, "--json"])
    out = capsys.readouterr().out
    assert code == 0
    return json.loads(out)


def test_json_has_every_field_and_drafters_agree(capsys, tiny_dir):
    base = ["Say something.", "--target", tiny_dir, "--temperature", "0", "--max-new-tokens", "20"]
    plain = run_json(capsys, *base, "--drafter", "none")
    assert set(plain) == {"text", "token_ids", "finish_reason", "stats"}
    assert set(plain["stats"]) >= STATS_FIELDS
    assert plain["finish_reason"] in {"stop", "length"}
    for drafter in ["ngram", f"model:{tiny_dir}"]:
        spec = run_json(capsys, *base, "--drafter", drafter, "--gamma", "3")
        assert spec["token_ids"] == plain["token_ids"]
        assert spec["text"] == plain["text"]


def test_streaming_prints_text_then_statistics(capsys, tiny_dir):
    code = main(["generate", "Hello", "--target", tiny_dir, "--max-new-tokens", "8", "--no-chat", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "tokens/s" in out and "alpha" in out and "acceptance by position" in out


def test_stop_string_and_sampling_flags(capsys, tiny_dir):
    args = ["Hello", "--target", tiny_dir, "--max-new-tokens", "30", "--temperature", "0.8", "--top-k", "50"]
    args += ["--top-p", "0.9", "--min-p", "0.05", "--seed", "7", "--no-chat"]
    a = run_json(capsys, *args)
    b = run_json(capsys, *args)
    assert a["token_ids"] == b["token_ids"]  # seeded runs repeat
    if len(a["text"]) > 6:
        stop = a["text"][3:6]
        c = run_json(capsys, *args, "--stop", stop)
        assert stop not in c["text"] and a["text"].startswith(c["text"])
        assert c["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--top-p", "0"], "top_p must be in (0, 1]"),
        (["--top-p", "1.5"], "top_p must be in (0, 1]"),
        (["--min-p", "1"], "min_p must be in [0, 1)"),
        (["--top-k", "-2"], "top_k must be >= 0"),
        (["--gamma", "-1"], "argument --gamma: must be >= 0"),
        (["--gamma", "lots"], "argument --gamma: must be an integer >= 0 or auto"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["--drafter", "bogus"], "unknown drafter"),
        (["--target", "/no/such/model"], "not found"),
        (["--device", "cuda:7"], "cuda"),
    ],
)
def test_bad_arguments_exit_nonzero_with_a_clear_message(capsys, tiny_dir, flags, message):
    args = ["generate", "hi", "--target", tiny_dir, *flags]
    if "--target" in flags:
        args = ["generate", "hi", *flags]
    if flags[0] == "--device":  # without torch: the cuda extra named; with it and no GPU: no CUDA here
        import importlib.util

        if importlib.util.find_spec("torch") is not None:
            import torch

            if torch.cuda.is_available():
                pytest.skip("CUDA present")
    try:
        code = main(args)
    except SystemExit as exit_:  # argparse rejects badly typed values itself
        code = exit_.code
    captured = capsys.readouterr()
    assert code != 0
    assert message in captured.err
    assert captured.out == ""


def test_vocabulary_mismatch_fails_before_generating(capsys, tiny_dir, other_vocab_dir):
    code = main(["generate", "hi", "--target", tiny_dir, "--drafter", f"model:{other_vocab_dir}", "--json"])
    captured = capsys.readouterr()
    assert code == 2
    assert "draft vocabulary (500) differs from target's (49152)" in captured.err
    assert captured.out == ""


def test_console_script_reports_errors_on_stderr():
    proc = subprocess.run(
        [sys.executable, "-m", "specwise.cli", "generate", "hi", "--temperature", "-0.5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "temperature must be >= 0" in proc.stderr


# ------------------------------------------------------------------------------- bad input: one line, no traceback


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> dict[str, str]:
    """Files that are not models: text named .gguf, text named .txt, the default GGUF's first 100 bytes, and a
    bench directory whose results.json is not JSON."""
    from specwise.models.loader import default_gguf_path

    root = tmp_path_factory.mktemp("bad-input")
    (root / "notes.gguf").write_text("hello, not a model\n")
    (root / "notes.txt").write_text("hello, not a model\n")
    with open(default_gguf_path(), "rb") as fh:
        (root / "truncated.gguf").write_bytes(fh.read(100))
    (root / "bench").mkdir()
    (root / "bench" / "results.json").write_text('{"runs": [')
    names = ["notes.gguf", "notes.txt", "truncated.gguf", "bench"]
    return {name.replace(".", "_"): str(root / name) for name in names}


def specwise(*args: str, env: dict[str, str] | None = None, code: str | None = None) -> subprocess.CompletedProcess:
    """Run the command line as a program (``python -m specwise``, or ``code`` then main) without SPECWISE_DEBUG."""
    environ = {k: v for k, v in os.environ.items() if k != "SPECWISE_DEBUG"} | (env or {})
    program = ["-c", f"import sys, specwise.cli as cli; {code}; sys.exit(cli.main())"] if code else ["-m", "specwise"]
    return subprocess.run([sys.executable, *program, *args], capture_output=True, text=True, timeout=300, env=environ)


def assert_one_line(proc: subprocess.CompletedProcess, fragment: str, status: int = 2, prefix: str = "error") -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == status, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"specwise: {prefix}: ") and fragment in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


BAD_INPUT = {
    "a missing file": (["generate", "hi", "--target", "/no/such/model.gguf"], "GGUF file not found"),
    "a text file named .gguf": (["generate", "hi", "--target", "{notes_gguf}"], "not a GGUF file"),
    "a text file as the model": (["generate", "hi", "--target", "{notes_txt}"], "notes.txt"),
    "a truncated GGUF": (["generate", "hi", "--target", "{truncated_gguf}"], "cannot fit"),
    "a truncated GGUF as the drafter": (["generate", "hi", "--drafter", "model:{truncated_gguf}"], "cannot fit"),
    "a truncated GGUF served": (["serve", "--target", "{truncated_gguf}", "--port", "0"], "cannot fit"),
    "a bad flag value": (["generate", "hi", "--gamma", "lots"], "argument --gamma: must be an integer"),
    "a flag value of the wrong type": (["serve", "--port", "abc"], "argument --port: invalid int value"),
    "a value the command refuses": (["generate", "hi", "--temperature", "-1"], "temperature must be >= 0"),
    "a missing argument": (["generate"], "the following arguments are required: prompt"),
    "an unknown subcommand": (["bogus"], "invalid choice: 'bogus'"),
    "results that are not JSON": (["bench", "--out", "{bench}", "--report-only"], "results.json: Expecting value"),
}


# the cases whose command checks its extra first (without it, the line names the extra instead)
NEEDS_EXTRA = {"a truncated GGUF served": "server", "results that are not JSON": "bench"}


def _installed(extra: str) -> bool:
    import importlib.util

    from specwise.extras import EXTRAS

    return all(importlib.util.find_spec(name) is not None for name in EXTRAS[extra])


@pytest.mark.parametrize(("args", "fragment"), BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_is_one_line_on_stderr_and_a_nonzero_status(bad_files, args, fragment, request):
    extra = NEEDS_EXTRA.get(request.node.callspec.id)
    if extra is not None and not _installed(extra):
        fragment = f"pip install 'specwise[{extra}]'"
    proc = specwise(*(arg.format(**bad_files) for arg in args))
    assert_one_line(proc, fragment)


@pytest.mark.parametrize(
    ("where", "env"),
    [("env", {"SPECWISE_DEBUG": "1"}), ("after", {}), ("before", {})],
    ids=["SPECWISE_DEBUG=1", "--debug after", "--debug before"],
)
def test_debug_shows_the_traceback_then_the_line(bad_files, where, env):
    args = ["generate", "hi", "--target", bad_files["truncated_gguf"]]
    args = {"env": args, "after": [*args, "--debug"], "before": ["--debug", *args]}[where]
    proc = specwise(*args, env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "Traceback (most recent call last)" in proc.stderr and "GGUFError" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("specwise: error: ") and "cannot fit" in proc.stderr


def test_a_bug_is_one_line_saying_so_and_how_to_see_the_traceback():
    boom = "def boom(args): raise RuntimeError('the engine fell over'); cli.cmd_generate = boom"
    code = "exec(" + repr(boom.replace("; cli", "\ncli")) + ")"
    proc = specwise("generate", "hi", code=code)
    assert_one_line(proc, "RuntimeError: the engine fell over", status=1, prefix="internal error")
    assert "a bug in specwise" in proc.stderr and "SPECWISE_DEBUG=1" in proc.stderr and "report it" in proc.stderr
    debug = specwise("generate", "hi", code=code, env={"SPECWISE_DEBUG": "1"})
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.count("RuntimeError: the engine fell over") == 2  # the traceback's last line, then the line


def test_an_interrupt_exits_130_quietly():
    code = "exec(" + repr("def stop(args): raise KeyboardInterrupt\ncli.cmd_generate = stop") + ")"
    proc = specwise("generate", "hi", code=code)
    assert proc.returncode == 130 and proc.stderr == "" and proc.stdout == ""


def test_one_line_joins_the_lines_of_a_message():
    from specwise.cli import one_line

    assert one_line(ValueError("results do not match:\n  a: missing\n  b: missing")) == (
        "results do not match: a: missing; b: missing"
    )
    assert one_line(ValueError()) == "ValueError"


def test_the_cpu_device_needs_no_torch():
    """``--device cpu`` and ``auto`` without torch choose the CPU without importing torch."""
    script = (
        "import sys, importlib.util as u\n"
        "real = u.find_spec\n"
        "u.find_spec = lambda name, *a: None if name == 'torch' else real(name, *a)\n"
        "from specwise.runtime import resolve_device\n"
        "assert resolve_device('cpu') == 'cpu' and resolve_device('auto') == 'cpu'\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def test_cuda_without_torch_names_the_extra(monkeypatch, capsys):
    import importlib.util

    from specwise.extras import MissingExtraError
    from specwise.runtime import resolve_device

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(MissingExtraError, match=r"pip install 'specwise\[cuda\]'"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("tpu")
    assert main(["generate", "hi", "--device", "cuda:0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "specwise[cuda]" in err


def test_compare_decodes_plainly_too_and_says_whether_the_replies_are_identical(capsys):
    """--compare on the default model: the same request decoded plainly after the speculative reply, both rows of
    the table, and (greedy) the same tokens; with --json the plain result rides along under "plain"."""
    prompt = ["generate", "Write a Python function to find the largest element in a list.", "--max-new-tokens", "24"]
    assert main([*prompt, "--compare"]) == 0
    out = capsys.readouterr().out
    assert "plain " in out and "speculative (" in out and "the replies are identical" in out
    data = run_json(capsys, *prompt[1:], "--compare")
    assert data["plain"]["token_ids"] == data["token_ids"] and data["plain"]["stats"]["drafted"] == 0
    assert data["plain"]["stats"]["target_passes"] == data["plain"]["stats"]["new_tokens"]


def test_comparison_names_a_difference():
    from types import SimpleNamespace

    from specwise.cli import comparison

    def stats(tokens, passes, rate):
        return SimpleNamespace(new_tokens=tokens, target_passes=passes, tokens_per_second=rate)

    text = comparison("ngram", stats(8, 4, 200.0), [1, 2], stats(8, 8, 100.0), [1, 3])
    assert "speed-up 2.00x" in text and "DIFFERENT" in text and "2.00" in text.splitlines()[2]
    assert "in distribution" in comparison("ngram", stats(8, 4, 200.0), [1], stats(8, 8, 100.0), [2], sampled=True)
    assert "identical" in comparison("ngram", stats(8, 4, 200.0), [1], stats(8, 8, 100.0), [1])
