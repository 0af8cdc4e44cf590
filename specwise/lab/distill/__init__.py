"""Training drafters from a target: ``specwise distill``.

Stages, each cached and resumable:

1. data (:mod:`specwise.lab.distill.data`): the target answers human-written instruction prompts; its features and
   log-normalisers are stored in shards under the data directory;
2. training (:mod:`specwise.lab.distill.train`): a head drafter (:mod:`specwise.drafters.head`) learns the target's
   next-token distribution from those features, with several drafting steps unrolled;
3. report: held-out fidelity before and after (top-1 agreement, alpha per drafting step) and tau at a fixed
   gamma on held-out prompts, run through the engine.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from specwise.files import distill_dir, safe_name, write_json_atomic, write_text_atomic
from specwise.lab.answers import AnswerOptions, prompts_dir_label
from specwise.lab.distill.losses import LOSSES

__all__ = ["LOSSES", "DistillData", "DistillOptions", "held_out_split", "make_data", "run_distill"]


@dataclass
class DistillOptions(AnswerOptions):
    """What ``specwise distill`` answers (:class:`specwise.lab.answers.AnswerOptions`) and how it trains a head."""

    out: Path = Path("head")
    max_new_tokens: int = 192
    temperatures: tuple[float, ...] = (0.0, 0.0, 0.0, 1.0)  # by batch
    corpus_tokens: int = 100_000  # plain text (corpus_dir, *.txt) added to the training data as teacher-forced features
    max_self_prompts: int | None = None  # answer only the first batches of the self-prompts covering this many
    gen_batch_size: int = 64
    draft_vocab: int = 8192
    intermediate_size: int | None = None
    eval_prompts: int = 12
    eval_max_new_tokens: int = 96
    eval_gamma: int = 4
    resume: bool = False
    init: Path | None = None  # warm start: a trained head's directory (same target)
    data_only: bool = False
    target_precision: str = "float32"  # how the target is evaluated as it answers: float32 (reference) or q8 (native)


def held_out_split(paths: list[Path], every: int = 10) -> tuple[list[Path], list[Path]]:
    """Split shards into (train, held-out): every ``every``-th shard (by index, from the 10th) is held out."""
    train = [p for i, p in enumerate(paths) if i % every != every - 1]
    held = [p for i, p in enumerate(paths) if i % every == every - 1]
    if not held and len(paths) > 1:
        held, train = paths[-1:], paths[:-1]
    return train, held


def default_data_dir(target: str) -> Path:
    return distill_dir() / safe_name(target)


@dataclass
class DistillData:
    """The shards of a run's data: the target's answers to the prompts (split into training and held-out), to the
    passage tasks and to the requests it wrote itself, and its features over plain text (training only)."""

    data_dir: Path
    answers: list[Path]
    passages: list[Path]
    self_written: list[Path]
    corpus: list[Path]

    def split(self) -> tuple[list[Path], list[Path]]:
        """(training, held-out) shards: held-out fidelity is measured on answers to the prompts only."""
        train, held = held_out_split(self.answers)
        return train + self.passages + self.self_written + self.corpus, held

    def counts(self) -> dict:
        return {
            "data_dir": str(self.data_dir),
            "answer_shards": len(self.answers),
            "train_answer_shards": len(held_out_split(self.answers)[0]),
            "passage_shards": len(self.passages),
            "self_prompt_shards": len(self.self_written),
            "corpus_shards": len(self.corpus),
        }


def native_target(opts: DistillOptions):
    """The target as the native quantized model evaluates it, for ``--target-precision q8`` (None for float32)."""
    if opts.target_precision == "float32":
        return None
    from specwise.models.kernels.quant import quantized_available
    from specwise.models.loader import gguf_source
    from specwise.models.quantized import QuantizedModel

    path = gguf_source(opts.target)
    if opts.target_precision != "q8":
        raise ValueError(f"--target-precision {opts.target_precision!r}: use float32 or q8")
    if path is None or opts.device != "cpu" or not quantized_available():
        raise ValueError(
            "--target-precision q8 needs a GGUF target on the CPU with the native kernels built; "
            "use --target-precision float32 (the default) otherwise"
        )
    return QuantizedModel(path, precision="q8")


def make_data(
    opts: DistillOptions, loaded, prompts: list[str], tasks: list[str], log=print, native=None
) -> DistillData:
    """Generate (or reuse: every stage resumes) the shards of ``opts``' data for the target ``loaded``, from the
    gathered prompts and passage tasks (:func:`specwise.lab.answers.gather_prompts`); ``native`` (``native_target``)
    writes the answers to prompts and passage tasks with the native quantized model."""
    from specwise.lab.answers import corpus_files
    from specwise.lab.distill.data import corpus_shards, generate_shards, self_prompts

    data_dir = Path(opts.data_dir) if opts.data_dir else default_data_dir(opts.target)

    def answer(requests: list[str], name: str, limit: int | None = None, **extra) -> list[Path]:
        """The target's answers to ``requests`` in ``data_dir/name`` (only the first batches covering ``limit``)."""
        return generate_shards(
            loaded,
            requests,
            data_dir / name,
            batch_size=opts.gen_batch_size,
            max_new_tokens=opts.max_new_tokens,
            temperatures=opts.temperatures,
            seed=opts.seed,
            progress=opts.progress,
            max_batches=None if limit is None else -(-limit // opts.gen_batch_size),
            native=native,
            **extra,
        )

    log(f"data: {len(prompts)} prompts (using {opts.max_prompts or 'all'}) -> {data_dir / 'answers'}")
    data = DistillData(data_dir, answer(prompts, "answers", opts.max_prompts), [], [], [])
    files = corpus_files(Path(opts.corpus_dir)) if opts.corpus_dir is not None else []
    if tasks:
        log(f"data: {len(tasks)} passage tasks from {len(files)} files -> {data_dir / 'passages'}")
        data.passages = answer(tasks, "passages", max_prompt_tokens=512)
    if opts.self_prompts > 0:
        requests = self_prompts(
            loaded,
            opts.self_prompts,
            data_dir / "self_prompts",
            opts.seed,
            batch_size=opts.gen_batch_size,
            progress=opts.progress,
        )
        log(f"data: {len(requests)} requests written by the target -> {data_dir / 'self_prompts'}")
        data.self_written = answer(requests, "self_prompts", opts.max_self_prompts)
    if files and opts.corpus_tokens > 0:
        log(f"data: about {opts.corpus_tokens} tokens of text from {len(files)} files -> {data_dir / 'corpus'}")
        data.corpus = corpus_shards(
            loaded, files, data_dir / "corpus", opts.corpus_tokens, seed=opts.seed, progress=opts.progress
        )
    return data


def _start_head(opts: DistillOptions, loaded, train_shards):
    """The head training starts from: the checkpoint's (--resume), a trained head's (--init), or a new one with
    the draft vocabulary of the training data; a new start is saved in ``opts.out`` at once (its config)."""
    import torch

    from specwise.drafters.head import check_target, load_head, new_head, save_head
    from specwise.lab.distill.train import draft_vocabulary
    from specwise.runtime import eos_ids

    out, hf = Path(opts.out), loaded.hf_model
    if opts.resume and (out / "config.json").exists():
        head = load_head(out)
        check_target(head.config, hf, loaded.name)
        head.attach_target(hf)
        return head
    if opts.init is not None:
        head = load_head(Path(opts.init))
        check_target(head.config, hf, loaded.name)
        head.attach_target(hf)
    else:
        eos = eos_ids(loaded) or set()
        vocab = draft_vocabulary(train_shards, opts.draft_vocab, eos, loaded.model.vocab_size)
        head = new_head(hf, loaded.name, vocab, opts.intermediate_size, seed=opts.seed)
    out.mkdir(parents=True, exist_ok=True)
    save_head(head, out, dtype=torch.float32)  # the config and the initial weights, replaced at the end
    return head


def run_distill(opts: DistillOptions, cfg, log=print) -> dict:
    """Generate (or reuse) data, train a head into ``opts.out``, write its report. Returns the report."""
    import torch

    from specwise.drafters.head import save_head
    from specwise.lab.answers import gather_prompts
    from specwise.lab.distill.data import load_shards
    from specwise.lab.distill.train import make_batches, train_head
    from specwise.models.loader import load_model
    from specwise.models.threads import get_num_threads

    out = Path(opts.out)
    state_path = out / "train_state.pt"
    if state_path.exists() and not opts.resume:
        raise FileExistsError(
            f"{out} holds a training checkpoint: pass --resume to continue it, or choose another --out"
        )
    prompts, tasks = gather_prompts(opts)  # checked before the model loads
    started = time.time()
    torch.manual_seed(opts.seed)
    native = native_target(opts)  # refused before the reference loads
    loaded = load_model(opts.target, device=opts.device, impl="hf")
    data = make_data(opts, loaded, prompts, tasks, log, native)
    if opts.data_only:
        return data.counts()
    train_paths, held_paths = data.split()
    train_shards, held_shards = load_shards(train_paths), load_shards(held_paths)
    n_train = sum(len(s.tokens) for s in train_shards)
    n_held = sum(len(s.tokens) for s in held_shards)
    log(f"data: {n_train} training tokens in {len(train_paths)} shards, {n_held} held out in {len(held_paths)}")

    head = _start_head(opts, loaded, train_shards)
    head.to(opts.device)  # the frozen embedding and output rows are the target's, already there
    coverage = _coverage(held_shards, head.vocab_ids.cpu(), loaded.model.vocab_size)
    log(f"draft vocabulary: {head.config.draft_vocab_size} tokens cover {coverage:.2%} of held-out tokens")
    train = make_batches(train_shards, cfg.batch_tokens, cfg.max_seq_len, cfg.seed)
    held = make_batches(held_shards, cfg.batch_tokens, cfg.max_seq_len, cfg.seed)
    full_head = loaded.hf_model.get_output_embeddings().weight.detach()
    result = train_head(head, train, held, full_head, cfg, state_path, resume=opts.resume, progress=opts.progress)
    head.config.training = {
        "command": os.environ.get("SPECWISE_COMMAND", ""),
        "train_tokens": n_train,
        "held_out_tokens": n_held,
        "loss": cfg.loss,
        "steps_unrolled": cfg.steps_unrolled,
        "epochs": cfg.epochs,
        "seed": cfg.seed,
        "init": str(opts.init) if opts.init else None,
        "corpus_shards": len(data.corpus),
        "passage_shards": len(data.passages),
        "self_prompt_shards": len(data.self_written),
    }
    save_head(head, out, dtype=torch.float16)
    tau = measure_tau(loaded, out, held_shards, opts)
    report = {
        "target": opts.target,
        "draft_vocab_size": head.config.draft_vocab_size,
        "draft_vocab_coverage": round(coverage, 4),
        "train_tokens": n_train,
        "held_out_tokens": n_held,
        "seconds": round(time.time() - started, 1),
        "threads": get_num_threads(),
        **result,
        "engine": tau,
    }
    write_json_atomic(out / "report.json", report)
    write_model_card(out, report, head.config, opts)
    return report


def _machine(device: str = "cpu") -> str:
    import torch

    from specwise.machine import cpu_name
    from specwise.models.threads import get_num_threads

    if str(device).startswith("cuda") and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(device)
        return f"{gpu} ({device}), torch {torch.__version__}, CUDA {torch.version.cuda}; {_machine('cpu')}"

    cpu = cpu_name()
    return f"{cpu}, {os.cpu_count()} cores, {get_num_threads()} threads, torch {torch.__version__}"


def write_model_card(out: Path, report: dict, config, opts: DistillOptions) -> None:
    """README.md next to the weights: how the head was made and how well it drafts (from ``report``)."""
    after, before, engine = report["after"], report.get("before"), report["engine"]
    steps = len(after["alpha"])
    rows = [
        f"| {i + 1} | {after['top1_agreement'][i]:.3f} | {after['alpha'][i]:.3f} |"
        + (f" {before['top1_agreement'][i]:.3f} | {before['alpha'][i]:.3f} |" if before else " - | - |")
        for i in range(steps)
    ]
    training = config.training
    corpus = ""
    if training.get("passage_shards"):
        corpus += (
            f" Also the target's answers to {opts.passages} tasks on passages of `{opts.corpus_dir}` (summarise,"
            " extract, rewrite, continue; training split only)."
        )
    if training.get("self_prompt_shards"):
        corpus += (
            f" Also the target's answers to {opts.max_self_prompts or opts.self_prompts} requests the target wrote"
            f" itself (the first of {opts.self_prompts}, sampled from its"
            " chat template's user turn; training split only)."
        )
    if training.get("corpus_shards"):
        corpus += (
            f" Also about {opts.corpus_tokens} tokens of plain text from `{opts.corpus_dir}` (teacher-forced,"
            " training split only)."
        )
    start = (
        f" started from the head in `{training['init']}` (its weights and draft vocabulary);"
        if training.get("init")
        else ""
    )
    when = "before this run" if training.get("init") else "before training"
    limits = ", ".join(f"{k}: {'all' if v is None else v}" for k, v in opts.prompt_limits.items())
    source = prompts_dir_label(opts.prompts_dir) if opts.prompts_dir is not None else "a prompts directory"
    text = f"""# Head drafter for {report["target"]} ({config.target.get("name")})

A specwise head drafter: one decoder layer (hidden {config.hidden_size}, {config.num_heads} heads,
{config.num_kv_heads} KV heads, MLP {config.intermediate_size}) that reads the target's last hidden states and
reuses its embedding and output layer, restricted to a draft vocabulary of {config.draft_vocab_size} tokens
({report["draft_vocab_coverage"]:.1%} of held-out tokens). Use it with `--drafter head:DIR` (for the default
model, `--drafter head` or the default `auto`). Speculative decoding with it is exact: the output follows the
target's distribution whatever the head proposes.

## How it was made

- Command: `{training.get("command") or "(library call)"}`
- Data: the target's own answers (max {opts.max_new_tokens} new tokens; temperatures {list(opts.temperatures)} by
  batch) to human-written prompts from {source} ({limits}; first {opts.max_prompts or "all"}
  prompts of the seeded shuffle).{corpus} No Spec-Bench question was used.
  {report["train_tokens"]} training tokens, {report["held_out_tokens"]} held-out tokens (every 10th shard).
- Training:{start} loss `{training.get("loss")}`, {training.get("steps_unrolled")} drafting steps unrolled, {
        training.get("epochs")
    } epochs, {report["steps"]} optimizer steps, seed {training.get("seed")}.
- Time: {report["seconds"] / 60:.1f} minutes for the training and report (data generation not included when
  it was cached). Hardware: {_machine(opts.device)}.

## Fidelity on held-out data (teacher-forced, per drafting step)

Top-1 agreement is the greedy acceptance rate of one drafted token; alpha = sum min(p, q) is the acceptance rate
when sampling at temperature 1.

| step | top-1 agreement | alpha | top-1 {when} | alpha {when} |
|---|---|---|---|---|
{chr(10).join(rows)}

## Through the engine

Greedy, gamma = {engine["gamma"]}, {engine["prompts"]} held-out prompts, {engine["max_new_tokens"]} new tokens each:
tau (tokens per target pass) = {engine["tau"]:.2f}, acceptance rate = {engine["acceptance_rate"]:.3f}, acceptance by
position {[round(x, 3) for x in engine["acceptance_by_position"] or []]}.

The full numbers are in `report.json`.
"""
    write_text_atomic(out / "README.md", text)


def _coverage(shards, vocab_ids, vocab_size: int) -> float:
    """Share of the shards' tokens inside the draft vocabulary."""
    from specwise.lab.distill.train import token_counts

    if not shards:
        return float("nan")
    counts = token_counts(shards, vocab_size)
    return float(counts[vocab_ids].sum() / counts.sum().clamp_min(1))


def measure_tau(loaded, head_dir: Path, held_shards, opts: DistillOptions) -> dict:
    """Greedy tau and acceptance of the saved head at ``eval_gamma`` on held-out prompts, through the engine."""
    from specwise.drafters import make_drafter
    from specwise.engine import Engine
    from specwise.metrics import SpecStats
    from specwise.models.loader import LoadedModel
    from specwise.models.native import NativeModel, native_supported
    from specwise.runtime import eos_ids

    model = loaded.model
    if native_supported(loaded.hf_model) is None and not isinstance(model, NativeModel):
        model = NativeModel(loaded.hf_model, name=loaded.name)
    target = LoadedModel(model, loaded.tokenizer, loaded.name, loaded.hf_model)
    drafter = make_drafter(f"head:{head_dir}", target, device=opts.device)
    engine = Engine(model, drafter, gamma=opts.eval_gamma, tokenizer=loaded.tokenizer, eos_token_ids=eos_ids(loaded))
    prompts = [seq[0][: seq[3]].tolist() for s in held_shards for seq in s.sequences() if seq[3] > 0]
    prompts = prompts[: opts.eval_prompts]
    total = SpecStats()
    for prompt in prompts:
        stats = engine.generate(prompt, max_new_tokens=opts.eval_max_new_tokens).stats
        total.merge(stats)
    out = total.to_dict()
    return {
        "prompts": len(prompts),
        "gamma": opts.eval_gamma,
        "max_new_tokens": opts.eval_max_new_tokens,
        "tau": out.get("mean_accepted_length"),
        "acceptance_rate": out.get("acceptance_rate"),
        "acceptance_by_position": out.get("acceptance_by_position"),
    }
