"""Distillation: batched data generation, losses, training with checkpoints and resume, the CLI end to end.

Training is torch code (the distill extra, which brings the hf extra): without torch and transformers the module is
skipped; that `specwise distill` then names its extra is tested in test_models.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import needs_hf, tiny_llama

torch = needs_hf()  # the whole module

from specwise.drafters.head import new_head  # noqa: E402
from specwise.engine import Engine  # noqa: E402
from specwise.lab.answers import PromptSource, collect_prompts  # noqa: E402
from specwise.lab.distill.data import _generate_batch, _pack, load_shards  # noqa: E402
from specwise.lab.distill.train import (  # noqa: E402
    TrainConfig,
    _token_loss,
    draft_vocabulary,
    evaluate,
    make_batches,
    train_head,
)
from specwise.models import HFModel  # noqa: E402


def _tiny_shards(hf, n_prompts=6, max_new=12, temperature=0.0):
    prompts = [[1 + i, 5, 7 + i, 3][: 2 + i % 3] for i in range(n_prompts)]
    gen = torch.Generator().manual_seed(0)
    rows = _generate_batch(hf, prompts, max_new, eos={0}, pad_id=0, temperature=temperature, generator=gen)
    return [_pack(rows, [len(p) for p in prompts])], prompts, rows


def test_batched_generation_equals_one_sequence_at_a_time():
    hf = tiny_llama(seed=1)
    _, prompts, rows = _tiny_shards(hf)
    engine = Engine(HFModel(hf), None, gamma=0)
    for prompt, (tokens, feats, lse) in zip(prompts, rows):
        want = engine.generate(prompt, max_new_tokens=12, eos_token_ids=[0]).token_ids
        assert tokens == prompt + want
        with torch.no_grad():
            ids = torch.tensor([tokens[:-1]])
            hidden = hf.model(input_ids=ids).last_hidden_state[0]
            logits = hf(input_ids=ids).logits[0]
        torch.testing.assert_close(feats.float(), hidden, atol=2e-3, rtol=2e-3)  # stored as float16
        torch.testing.assert_close(lse, torch.logsumexp(logits, -1), atol=1e-4, rtol=1e-4)


def test_collect_prompts_is_seeded_and_limited(tmp_path):
    path = tmp_path / "a.prompts.jsonl"
    # a U+2028 inside a prompt must not split the line
    path.write_text("".join(json.dumps({"prompt": f"q{i}\u2028x", "source": "t"}) + "\n" for i in range(20)))
    a = collect_prompts([PromptSource(path, 5)], seed=1)
    assert a == collect_prompts([PromptSource(path, 5)], seed=1) and len(a) == 5
    assert a != collect_prompts([PromptSource(path, 5)], seed=2)
    with pytest.raises(FileNotFoundError, match="prompts-dir"):
        collect_prompts([PromptSource(tmp_path / "missing.jsonl")], seed=0)


def test_token_losses_are_zero_at_p_equals_q_and_positive_otherwise():
    p = torch.log_softmax(torch.randn(4, 10), -1)
    q = torch.log_softmax(torch.randn(4, 10), -1)
    for kind in ("tv", "jsd"):
        assert float(_token_loss(kind, p, p).abs().max()) < 1e-6
        assert float(_token_loss(kind, q, p).min()) > 0
    # kl is a cross-entropy: minimised (down to the entropy of p) at q = p
    assert float((_token_loss("kl", q, p) - _token_loss("kl", p, p)).min()) > 0


def _setup(steps=2):
    hf = tiny_llama(seed=1, vocab=40)
    shards, _, _ = _tiny_shards(hf, n_prompts=16, max_new=16, temperature=1.0)
    vocab = draft_vocabulary(shards, 32, {0}, 40)
    head = new_head(hf, "tiny", vocab, seed=0)
    batches = make_batches(shards, batch_tokens=64, max_len=32, seed=0)
    cfg = TrainConfig(steps_unrolled=steps, epochs=6, lr=3e-3, warmup=5, eval_every=1000, checkpoint_every_s=1e9)
    return hf, head, batches, cfg


def test_training_improves_held_out_fidelity_and_resume_is_exact(tmp_path):
    hf, head, batches, cfg = _setup()
    full = hf.get_output_embeddings().weight.detach()
    report = train_head(head, batches, batches[:2], full, cfg, tmp_path / "s.pt", progress=False, log=lambda m: None)
    before, after = report["before"], report["after"]
    assert 0 <= before["alpha"][0] <= 1 and 0 <= after["top1_agreement"][0] <= 1
    assert after["alpha"][0] > before["alpha"][0] + 0.05
    assert len(after["alpha"]) == 2
    # the same run in two halves, through a checkpoint, ends with identical weights
    _, head2, _, _ = _setup()
    half = TrainConfig(**{**cfg.__dict__})
    state = tmp_path / "r.pt"
    total = int(cfg.epochs * len(batches))
    train_head(head2, batches, batches[:2], full, half, state, progress=False, log=lambda m: None, max_steps=total // 2)
    _, head3, _, _ = _setup()
    train_head(head3, batches, batches[:2], full, cfg, state, resume=True, progress=False, log=lambda m: None)
    for (name, a), b in zip(head.state_dict().items(), head3.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)


def test_evaluate_an_untrained_head():
    hf, head, batches, _ = _setup(steps=1)
    ev = evaluate(head, batches[:2], 1, hf.get_output_embeddings().weight.detach())
    assert ev["positions"] > 0 and ev["top1_agreement"][0] < 0.9


def _write_prompts(directory, count: int, template: str):
    """A prompts directory like shared/data/prompts: ``count`` prompts per file, ``template`` formatted with the
    file's name and the prompt's index."""
    directory.mkdir()
    for name in ("oasst_en", "mbpp", "gsm8k_train"):
        rows = [{"prompt": template.format(name=name, i=i), "source": "test"} for i in range(count)]
        (directory / f"{name}.prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return directory


def _small_distill_args(tiny_dir, prompts, data) -> list[str]:
    """`specwise distill` options for a fast run on the tiny target."""
    args = ["--target", tiny_dir, "--prompts-dir", str(prompts), "--data-dir", str(data), "--no-progress"]
    return args + ["--max-new-tokens", "6", "--gen-batch-size", "4", "--gsm8k-limit", "4", "--draft-vocab", "256"]


@pytest.mark.slow
def test_distill_cli_end_to_end(tmp_path, tiny_dir, capsys):
    from specwise.cli import main

    prompts = _write_prompts(tmp_path / "prompts", 10, "Tell me about {name} number {i}.")
    out = tmp_path / "head"
    args = ["distill", "--target", tiny_dir, "--out", str(out), "--prompts-dir", str(prompts)]
    args += ["--data-dir", str(tmp_path / "data"), "--max-new-tokens", "8", "--gen-batch-size", "4"]
    args += ["--draft-vocab", "512", "--epochs", "2", "--eval-prompts", "2", "--no-progress", "--gsm8k-limit", "4"]
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["after"]["positions"] > 0 and report["engine"]["prompts"] == 2
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    assert main(args) == 2  # a checkpoint exists: refuse to overwrite it without --resume
    assert "--resume" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0
    gen = ["generate", "hello", "--target", tiny_dir, "--drafter", f"head:{out}", "--max-new-tokens", "8", "--json"]
    assert main(gen) == 0
    plain = ["generate", "hello", "--target", tiny_dir, "--drafter", "none", "--max-new-tokens", "8", "--json"]
    capsys.readouterr()
    main(gen)
    with_head = json.loads(capsys.readouterr().out)
    main(plain)
    assert json.loads(capsys.readouterr().out)["token_ids"] == with_head["token_ids"]
    assert load_shards(sorted((tmp_path / "data" / "answers").glob("*.safetensors")))


def test_passage_prompts_are_seeded_tasks_on_whole_paragraphs(tmp_path):
    from specwise.lab.answers import PASSAGE_TASKS, passage_prompts

    book = tmp_path / "book.txt"
    paras = [f"Paragraph {i} tells of a walk by the river and a talk about the weather." for i in range(40)]
    book.write_text("The Project Gutenberg licence applies.\n\n" + "\n\n".join(paras))
    prompts = passage_prompts([book], 3, seed=1, words=30)
    assert prompts == passage_prompts([book], 3, seed=1, words=30) != passage_prompts([book], 3, seed=2, words=30)
    assert len(prompts) == 3
    for prompt in prompts:
        assert "Gutenberg" not in prompt
        assert any(
            prompt.startswith(t.split("{text}")[0]) and prompt.endswith(t.split("{text}")[1]) for t in PASSAGE_TASKS
        )
    with pytest.raises(ValueError, match="no passages"):
        passage_prompts([book], 3, seed=1, words=10_000)


def test_distill_data_only_corpus_and_warm_start(tmp_path, tiny_dir, capsys):
    """--data-only stops after the data; --corpus-dir adds teacher-forced text to training only; --init starts
    from a trained head (same draft vocabulary), and the model card says so."""
    from specwise.cli import main
    from specwise.drafters.head import load_head

    prompts = _write_prompts(tmp_path / "prompts", 8, "Say something about {name} {i}.")
    corpus = tmp_path / "corpus" / "books"
    corpus.mkdir(parents=True)
    (corpus / "a.txt").write_text("It was a bright cold day in April, and the clocks were striking.\n\n" * 60)
    (corpus / "b.txt").write_text("The sea was calm and the boats came home one by one at dusk.\n\n" * 60)
    data = tmp_path / "data"
    common = _small_distill_args(tiny_dir, prompts, data)
    first = tmp_path / "first"
    assert main(["distill", "--out", str(first), *common, "--data-only", "--passages", "4"]) == 2
    assert "--corpus-dir" in capsys.readouterr().err
    assert main(["distill", "--out", str(first), *common, "--data-only"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["answer_shards"] == 5 and summary["corpus_shards"] == 0
    assert not first.exists()  # no head without training
    with_corpus = [*common, "--corpus-dir", str(tmp_path / "corpus"), "--corpus-tokens", "512", "--passages", "4"]
    assert main(["distill", "--out", str(first), *with_corpus, "--epochs", "1", "--eval-prompts", "1"]) == 0
    corpus_files = sorted((data / "corpus").glob("corpus_*.safetensors"))
    assert corpus_files
    pieces = load_shards(corpus_files)
    assert sum(len(s.prompt_lengths) for s in pieces) == 2  # 512 tokens in pieces of 256
    assert all(int(p) == 0 for s in pieces for p in s.prompt_lengths)
    tasks = load_shards(sorted((data / "passages").glob("shard_*.safetensors")))
    assert sum(len(s.prompt_lengths) for s in tasks) == 4
    report = json.loads((first / "report.json").read_text())
    assert report["train_tokens"] > sum(len(s.tokens) for s in pieces + tasks)
    card = (first / "README.md").read_text()
    assert "plain text" in card and "tasks on passages" in card

    second = tmp_path / "second"
    assert main(["distill", "--out", str(second), *common, "--init", str(first), "--epochs", "1"]) == 0
    a, b = load_head(first), load_head(second)
    assert torch.equal(a.vocab_ids, b.vocab_ids)
    before = json.loads((second / "report.json").read_text())["before"]
    # the warm start's starting point is the first head (saved in float16), on the same held-out data
    for key in ("top1_agreement", "alpha"):
        assert before[key] == pytest.approx(report["after"][key], abs=0.02)
    card = (second / "README.md").read_text()
    assert "started from the head" in card and "before this run" in card


def test_self_prompts_sampling_stops_at_the_end_of_the_turn(tiny_dir):
    """The sampler returns the tokens before a stop token, and None for rows that never stop."""
    from specwise.lab.distill.data import _sample_rows
    from specwise.models import load_model

    loaded = load_model(tiny_dir, impl="hf")
    vocab = loaded.model.vocab_size
    gen = torch.Generator().manual_seed(0)
    assert _sample_rows(loaded.hf_model, [1, 2, 3], 3, 4, set(), gen, "cpu") == [None, None, None]
    # every token but token 7 stops: rows are runs of 7 (usually empty) ending at the first other token
    rows = _sample_rows(loaded.hf_model, [1, 2, 3], 4, 5, set(range(vocab)) - {7}, gen, "cpu")
    assert all(r is not None and set(r) <= {7} for r in rows)


def test_self_prompts_are_filtered_cached_and_resumed(tmp_path, tiny_dir, monkeypatch):
    """Requests written by the target: too short, unfinished and repeated ones are dropped, the kept ones are
    cached after every batch, a second call continues from the cache, and another seed is refused."""
    import specwise.lab.distill.data as data
    from specwise.models import load_model

    loaded = load_model(tiny_dir, impl="hf")
    tok = loaded.tokenizer
    words = ["Tell me about rivers and lakes.", "How do bees make honey?", "Hi", "Write a poem about snow."]
    calls = []

    def fake_rows(hf_model, prefix, batch, max_tokens, stop, generator, device):
        calls.append(prefix)
        i = len(calls)
        texts = [words[(i + j) % len(words)] for j in range(batch)]
        rows = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        rows[0] = None  # did not end its turn
        return rows

    monkeypatch.setattr(data, "_sample_rows", fake_rows)
    out = tmp_path / "self"
    got = data.self_prompts(loaded, 2, out, seed=0, batch_size=3, min_tokens=3, progress=False)
    assert len(got) == 2 and "Hi" not in got and len(set(got)) == 2
    assert tok.decode(calls[0]).rstrip().endswith("user")  # the chat template opened up to the user's turn
    cached = json.loads((out / "prompts.json").read_text())
    assert cached["prompts"][:2] == got
    more = data.self_prompts(loaded, 3, out, seed=0, batch_size=3, min_tokens=3, progress=False)
    assert more[:2] == got and len(more) == 3 and len(set(more)) == 3
    n = len(calls)
    assert data.self_prompts(loaded, 3, out, seed=0, batch_size=3, min_tokens=3, progress=False) == more
    assert len(calls) == n  # served from the cache
    with pytest.raises(ValueError, match="another target or seed"):
        data.self_prompts(loaded, 3, out, seed=1, batch_size=3, progress=False)
    monkeypatch.setattr(data, "_sample_rows", lambda *a: [None] * 3)
    with pytest.raises(RuntimeError, match="too few usable prompts"):
        data.self_prompts(loaded, 5, tmp_path / "none", seed=0, batch_size=3, progress=False)


def test_distill_cli_self_prompts(tmp_path, tiny_dir, capsys, monkeypatch):
    """--self-prompts: the target's own requests are answered into their own shards (the first batches only with
    --max-self-prompts), used for training only, and named in the model card."""
    from transformers import AutoTokenizer

    import specwise.lab.distill.data as data
    from specwise.cli import main

    tok = AutoTokenizer.from_pretrained(tiny_dir)

    def fake_rows(hf_model, prefix, batch, max_tokens, stop, generator, device):
        seed = int(torch.randint(0, 10_000, (1,), generator=generator))
        return [
            tok(f"Question {seed} {j}: what is {j} + {j}?", add_special_tokens=False)["input_ids"] for j in range(batch)
        ]

    monkeypatch.setattr(data, "_sample_rows", fake_rows)
    prompts = _write_prompts(tmp_path / "prompts", 8, "Say something about {name} {i}.")
    data_dir = tmp_path / "data"
    out = tmp_path / "head"
    args = ["distill", "--out", str(out), *_small_distill_args(tiny_dir, prompts, data_dir)]
    args += ["--self-prompts", "6", "--max-self-prompts", "4", "--epochs", "1", "--eval-prompts", "1"]
    assert main(args) == 0
    written = json.loads((data_dir / "self_prompts" / "prompts.json").read_text())["prompts"]
    assert len(written) == 6
    shards = load_shards(sorted((data_dir / "self_prompts").glob("shard_*.safetensors")))
    assert sum(len(s.prompt_lengths) for s in shards) == 4  # the first batch of the plan (--max-self-prompts)
    report = json.loads((out / "report.json").read_text())
    answers = load_shards(sorted((data_dir / "answers").glob("shard_*.safetensors")))
    assert report["train_tokens"] + report["held_out_tokens"] == sum(len(s.tokens) for s in answers + shards)
    assert "requests the target wrote itself" in (out / "README.md").read_text()


def test_a_damaged_data_shard_is_refused(tmp_path):
    """A data shard is a cached file, read as untrusted: a bad file, a missing tensor, a wrong dtype and offsets
    that leave the tokens are refused with one line naming the file."""
    from safetensors.torch import save_file

    from specwise.lab.distill.data import ShardFileError, _shard_tensors

    hf = tiny_llama(seed=1, vocab=40)
    shards, _, _ = _tiny_shards(hf, n_prompts=3, max_new=4)
    good = _shard_tensors(shards[0])
    path = tmp_path / "shard_00000.safetensors"
    damages = {
        "not a readable safetensors file": None,
        "holds the tensors": lambda t: t.pop("lse"),
        "tensor 'tokens' is torch.int64": lambda t: t.__setitem__("tokens", t["tokens"].long()),
        "disagree on their lengths": lambda t: t.__setitem__("lse", t["lse"][1:]),
        "offsets do not rise": lambda t: t.__setitem__("offsets", t["offsets"] + 1000),
    }
    for match, damage in damages.items():
        if damage is None:
            path.write_bytes(b"\x10" + bytes(20))
        else:
            tensors = dict(good)
            damage(tensors)
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
        with pytest.raises(ShardFileError, match=match) as info:
            load_shards([path])
        assert str(path) in str(info.value) and "\n" not in str(info.value)
    save_file({k: v.contiguous() for k, v in good.items()}, str(path))
    assert torch.equal(load_shards([path])[0].tokens, good["tokens"])


def test_native_generation_equals_the_quantized_models_own_answers(tmp_path):
    """--target-precision q8: a batch answered in one pass per step over its unfinished rows gives each row the
    q8 model's own greedy answer, its features and its log-normalisers, rows ending at their own end tokens."""
    pytest.importorskip("gguf")
    from test_quantized_model import VARIANTS, write_gguf

    from specwise.lab.distill.data import _generate_batch_native, generate_shards
    from specwise.models.quantized import QuantizedModel

    spec = VARIANTS["llama-Q4_1"]  # answers that vary (others repeat a token)
    path = tmp_path / "tiny.gguf"
    write_gguf(path, spec)
    model = QuantizedModel(path, precision="q8")
    prompts = [[3, 9, 4], [7, 1, 1, 5, 2], [11], [6, 6, 8, 2]]
    plain = Engine(QuantizedModel(path, precision="q8"), None, gamma=0)
    first = plain.generate(prompts[0], max_new_tokens=10).token_ids
    end = next(j for j in range(2, 9) if first[j] not in first[:j])  # the first row ends at its token `end`
    eos = {first[end]}  # the others where they write it, or after 10 tokens
    rows = _generate_batch_native(model, prompts, 10, eos, 0.0, torch.Generator().manual_seed(0))
    assert rows[0][0] == prompts[0] + first[: end + 1]
    for prompt, (tokens, feats, lse) in zip(prompts, rows):
        want = plain.generate(prompt, max_new_tokens=10, eos_token_ids=sorted(eos)).token_ids
        assert tokens == prompt + want
        fresh = QuantizedModel(path, precision="q8")
        fresh.keep_features = True
        logits = torch.from_numpy(fresh.forward(np.array(tokens[:-1])))  # the model's numpy logits
        assert feats.shape == (len(tokens) - 1, spec.hidden) and feats.dtype == torch.float16
        want = torch.from_numpy(fresh.features(0, len(tokens) - 1)).to(torch.float16)
        torch.testing.assert_close(feats, want)
        torch.testing.assert_close(lse, torch.logsumexp(logits, -1), atol=1e-5, rtol=1e-5)

    class Tokenizer:
        pad_token_id, chat_template = 0, None

        def __call__(self, text):
            return {"input_ids": [len(text) % spec.vocab, 5]}

    # what generate_shards reads of a loaded target besides the native model
    loaded = SimpleNamespace(name="tiny", model=model, hf_model=None, eos_token_ids=eos, tokenizer=Tokenizer())
    (shard,) = generate_shards(loaded, ["ab"], tmp_path / "answers", max_new_tokens=4, native=model, progress=False)
    plan = json.loads((tmp_path / "answers" / "manifest.json").read_text())
    assert plan["evaluation"] == "q8"
    assert load_shards([shard])[0].features.dtype == torch.float16


def test_target_precision_q8_needs_a_gguf_target(tiny_dir):
    from specwise.lab.distill import DistillOptions, native_target

    assert native_target(DistillOptions(target=str(tiny_dir))) is None  # float32: the reference, as before
    with pytest.raises(ValueError, match="needs a GGUF target"):
        native_target(DistillOptions(target=str(tiny_dir), target_precision="q8"))
