"""The target answers prompts: the pipeline ``specwise distill`` and ``specwise index`` share.

Both commands gather requests the same way (human-written prompts from ``*.prompts.jsonl`` files, tasks on corpus
passages, requests the target writes itself), take the same options and command-line arguments for it, keep their
answers in a data directory whose plan (``manifest.json``) must match the run's, and answer request j at
``temperatures[j % n]`` with seed :func:`answer_seed` ``(seed, j)``. They differ in what they keep of an answer:
``index`` keeps its tokens (:func:`answer_in_chunks`, through the engine, any target), ``distill`` also the
target's features (:func:`specwise.lab.distill.data.generate_shards`, a Hugging Face model in batches).

The inputs are the user's files, in two plain formats:

- a prompts directory (``--prompts-dir``; default ``$SPECWISE_PROMPTS``, else the prompts shipped with specwise in
  ``specwise/shipped/prompts/``): every ``*.prompts.jsonl`` file in it, one JSON object a line with the prompt in
  ``"prompt"`` (other keys are ignored), e.g. ``{"prompt": "How do I care for a succulent?"}``;
- a corpus directory (``--corpus-dir``, for ``--passages``): plain-text ``*.txt`` files, searched recursively,
  whose paragraphs are separated by blank lines.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specwise.files import write_json_atomic

__all__ = [
    "PROMPT_FILES",
    "PASSAGE_TASKS",
    "SHIPPED_PROMPTS",
    "AnswerOptions",
    "PromptSource",
    "Answered",
    "add_arguments",
    "answer_in_chunks",
    "answer_options",
    "answer_seed",
    "check_plan",
    "check_sources",
    "collect_prompts",
    "corpus_files",
    "engine_answers",
    "gather_prompts",
    "passage_prompts",
    "progress_bar",
    "prompt_files",
    "prompts_dir_label",
    "record_command",
    "request_cache",
    "request_seed",
    "resolve_prompts_dir",
    "user_turn_prefix",
]

# Prompt files with a limit of their own (default_prompt_limits), read first and in this order where a prompts
# directory holds them: Open-Assistant prompts, MBPP task statements and GSM8K *training* questions. Any other
# *.prompts.jsonl file of the directory is read after them, by name, all of its rows.
PROMPT_FILES = ("oasst_en.prompts.jsonl", "mbpp.prompts.jsonl", "gsm8k_train.prompts.jsonl")
GSM8K = "gsm8k_train.prompts.jsonl"

# the prompts shipped with specwise (a public subset, its sources and licences in README.md there): the default
SHIPPED_PROMPTS = Path(__file__).resolve().parents[1] / "shipped" / "prompts"

# generate(prompt ids, temperature, seed) -> the answer's token ids (its end-of-sequence token included)
Generate = Callable[[list[int], float, int], list[int]]


def default_prompt_limits() -> dict[str, int | None]:
    return {"oasst_en.prompts.jsonl": None, "mbpp.prompts.jsonl": None, GSM8K: 1000}


@dataclass
class AnswerOptions:
    """What the target answers and how: the options ``distill`` and ``index`` share (each extends them)."""

    target: str = "default"
    out: Path = Path("out")
    data_dir: Path | None = None
    prompts_dir: Path | None = None
    prompt_limits: dict[str, int | None] = field(default_factory=default_prompt_limits)
    corpus_dir: Path | None = None
    passages: int = 0  # tasks on corpus passages (summarise, extract, ...), answered by the target
    self_prompts: int = 0  # user requests written by the target itself (Magpie-style), answered by the target
    max_prompts: int | None = None  # answer only the first requests of the plan (None: all)
    max_new_tokens: int = 192
    temperatures: tuple[float, ...] = (0.0,)
    seed: int = 0
    device: str = "cpu"
    progress: bool = True


# ------------------------------------------------------------------------------------------------ the requests


@dataclass
class PromptSource:
    """A prompts file and how many of its rows to use (None: all)."""

    path: Path
    limit: int | None = None


def resolve_prompts_dir(flag: str | Path | None = None) -> Path:
    """The prompts directory to read: ``flag`` (``--prompts-dir``) when given, else ``$SPECWISE_PROMPTS`` when set,
    else the prompts shipped with specwise (:data:`SHIPPED_PROMPTS`)."""
    if flag is not None:
        return Path(flag)
    env = os.environ.get("SPECWISE_PROMPTS")
    return Path(env) if env else SHIPPED_PROMPTS


def prompts_dir_label(directory: str | Path) -> str:
    """How a run's metadata names its prompts directory: the shipped one by its place in the package."""
    path = Path(directory)
    if path.resolve() == SHIPPED_PROMPTS:
        return "the prompts shipped with specwise (specwise/shipped/prompts)"
    return f"`{path}`"


def prompt_files(directory: Path, limits: dict[str, int | None]) -> list[PromptSource]:
    """The ``*.prompts.jsonl`` files of ``directory`` with their limits: those named in ``limits`` first (in its
    order, where present), then the others by name (all their rows)."""
    directory = Path(directory)
    found = {p.name: p for p in directory.glob("*.prompts.jsonl") if p.is_file()} if directory.is_dir() else {}
    if not found:
        raise FileNotFoundError(
            f"no *.prompts.jsonl files in {directory}: pass --prompts-dir DIR holding files of one "
            '{"prompt": "..."} object a line'
        )
    named = [PromptSource(found.pop(name), limit) for name, limit in limits.items() if name in found]
    return named + [PromptSource(found[name]) for name in sorted(found)]


def _read_prompts(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").split("\n")  # not splitlines: prompts may hold U+2028
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ValueError(f'{path}:{n}: not a JSON object with a "prompt" string: write one such object a line')
        rows.append(row["prompt"])
    return rows


def collect_prompts(sources: list[PromptSource], seed: int) -> list[str]:
    """Prompts from the given files, each subsampled with ``seed`` to its limit, then shuffled together."""
    rng = random.Random(seed)
    prompts: list[str] = []
    for source in sources:
        if not source.path.exists():
            raise FileNotFoundError(
                f"prompts file {source.path} not found: pass --prompts-dir DIR holding *.prompts.jsonl files"
            )
        rows = _read_prompts(source.path)
        if source.limit is not None and source.limit < len(rows):
            rows = rng.sample(rows, source.limit)
        prompts.extend(r for r in rows if r.strip())
    rng.shuffle(prompts)
    return prompts


def corpus_files(directory: Path) -> list[Path]:
    """The ``*.txt`` files under ``directory`` (recursively), sorted."""
    files = sorted(Path(directory).rglob("*.txt"))
    if not files:
        raise FileNotFoundError(
            f"no .txt files under {directory}: pass --corpus-dir DIR holding plain-text files (paragraphs separated "
            "by blank lines)"
        )
    return files


# Instructions wrapped around corpus passages: tasks on a given text (summarising, extracting, rewriting,
# answering, continuing), the kind of request that instruction prompts rarely contain.
PASSAGE_TASKS = (
    "Summarize the following passage in two or three sentences.\n\n{text}",
    "What is this passage about? Answer in a short paragraph.\n\n{text}",
    "List the people, places and objects mentioned in the text below.\n\n{text}",
    "Rewrite this passage in plain modern English.\n\n{text}",
    "{text}\n\nWhat happens in the passage above, and why does it matter?",
    "Here is a passage from a book:\n\n{text}\n\nWrite three questions a reader could answer from it, with answers.",
    "Read the passage and describe the mood and the feelings of the people in it.\n\n{text}",
    "{text}\n\nContinue this text for a few sentences in the same style.",
)


def passage_prompts(paths: list[Path], count: int, seed: int, words: int = 150) -> list[str]:
    """``count`` prompts pairing a random passage of about ``words`` words from the files with a task.

    Passages are runs of whole paragraphs (blank-line separated); those naming Project Gutenberg (licence and
    header text) are skipped.
    """
    rng = random.Random(seed)
    passages: list[str] = []
    for path in paths:
        paragraphs = [" ".join(p.split()) for p in path.read_text(encoding="utf-8", errors="replace").split("\n\n")]
        current: list[str] = []
        size = 0
        for para in paragraphs:
            if not para:
                continue
            current.append(para)
            size += len(para.split())
            if size >= words:
                text = "\n\n".join(current)
                if "gutenberg" not in text.lower() and size <= 2 * words:
                    passages.append(text)
                current, size = [], 0
    if not passages:
        raise ValueError("no passages found in the corpus files: they need blank-line separated paragraphs")
    chosen = rng.sample(passages, min(count, len(passages)))
    return [rng.choice(PASSAGE_TASKS).format(text=text) for text in chosen]


def check_sources(opts: AnswerOptions) -> None:
    """Refuse, before any model loads, options whose requests cannot be gathered."""
    if opts.prompts_dir is None:
        raise ValueError("no prompts directory: pass --prompts-dir DIR (*.prompts.jsonl files) or set SPECWISE_PROMPTS")
    if opts.passages > 0 and opts.corpus_dir is None:
        raise ValueError("passage tasks need a corpus: pass --corpus-dir DIR (plain-text *.txt files) with --passages")


def gather_prompts(opts: AnswerOptions) -> tuple[list[str], list[str]]:
    """(human-written prompts, tasks on corpus passages) of ``opts``, both seeded by ``opts.seed``; the requests
    the target writes itself need the model (:func:`user_turn_prefix`, :func:`request_cache`)."""
    check_sources(opts)
    prompts = collect_prompts(prompt_files(Path(opts.prompts_dir), opts.prompt_limits), opts.seed)
    tasks = []
    if opts.passages > 0:
        tasks = passage_prompts(corpus_files(Path(opts.corpus_dir)), opts.passages, opts.seed)
    return prompts, tasks


USER_MARKER = "\u0000specwise-user-message\u0000"


def user_turn_prefix(tokenizer) -> list[int]:
    """The chat template's tokens up to where a user's message starts (the target then writes the message)."""
    from specwise.runtime import encode_prompt

    templated = tokenizer.decode(encode_prompt(tokenizer, USER_MARKER, chat=True))
    if USER_MARKER not in templated:
        raise ValueError("this target has no chat template with a user turn: --self-prompts needs one")
    return list(tokenizer(templated[: templated.index(USER_MARKER)], add_special_tokens=False)["input_ids"])


def request_cache(path: Path, prefix: list[int], seed: int, counter: str) -> dict:
    """The cache of requests the target wrote (``prompts``, the ``prefix`` and ``seed`` they were written with, and
    ``counter``: the tries so far), new when ``path`` does not exist; one written for another target or seed is
    refused."""
    state = json.loads(path.read_text()) if path.exists() else {"prefix": prefix, "seed": seed, counter: 0}
    if state.get("prefix") != prefix or state.get("seed") != seed:
        raise ValueError(f"{path} was written for another target or seed: pass another --data-dir")
    state.setdefault("prompts", [])
    return state


# ------------------------------------------------------------------------------------------------- the answers


def answer_seed(seed: int, j: int) -> int:
    """The seed of answer (or batch) ``j`` of a run seeded ``seed``."""
    return seed * 1_000_003 + j


def request_seed(seed: int, n: int) -> int:
    """The seed of the target's ``n``-th try (or batch) at writing requests itself, in a run seeded ``seed``."""
    return answer_seed(seed, 7_919 + n)


def check_plan(data_dir: Path, plan: dict) -> None:
    """Record ``plan`` in ``data_dir/manifest.json``, or refuse a directory whose recorded plan differs (its
    answers were made with other settings: resuming them would mix two plans)."""
    path = data_dir / "manifest.json"
    if path.exists():
        recorded = json.loads(path.read_text())
        if recorded != plan:
            diff = sorted(k for k in plan if recorded.get(k) != plan[k])
            raise ValueError(
                f"{data_dir} holds data made with other settings ({', '.join(diff)} differ): "
                "pass another --data-dir, or the settings that made it"
            )
        return
    write_json_atomic(path, plan)


def engine_answers(engine, max_new_tokens: int) -> Generate:
    """A :data:`Generate` through ``engine`` (its target and drafter): the answer's token ids."""
    from specwise.sampling import SamplingParams

    def generate(prompt: list[int], temperature: float, seed: int) -> list[int]:
        params = SamplingParams(temperature=temperature, seed=seed)
        return engine.generate(prompt, params, max_new_tokens=max_new_tokens).token_ids

    return generate


class _LineBar:
    """A progress bar without tqdm (which the core install does not have): a line on stderr at most every
    ``every`` seconds, and one at the end."""

    def __init__(self, total: int, initial: int = 0, desc: str = "", unit: str = "it", every: float = 30.0) -> None:
        self.total, self.n, self.desc, self.unit, self.every = total, initial, desc, unit, every
        self.postfix = ""
        self._shown = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self._shown >= self.every:
            self._show()

    def set_postfix(self, **values) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def _show(self) -> None:
        self._shown = time.monotonic()
        extra = f" ({self.postfix})" if self.postfix else ""
        print(f"{self.desc}: {self.n}/{self.total} {self.unit}s{extra}", file=sys.stderr, flush=True)

    def close(self) -> None:
        self._show()


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **values) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, unit: str, initial: int = 0, progress: bool = True):
    """tqdm's bar where tqdm is installed, else a line on stderr now and then; nothing without ``progress``. Its
    methods: ``update(n)``, ``set_postfix(**values)``, ``close()``."""
    if not progress:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ModuleNotFoundError:
        return _LineBar(total, initial, desc, unit)
    return tqdm(total=total, initial=initial, desc=desc, unit=unit)


@dataclass
class Answered:
    """The answers of :func:`answer_in_chunks`: per chunk, up to and with the first one the budget cut short."""

    chunks: list[list[list[int]]]
    generated: int  # tokens of all the answers, earlier runs' included
    this_run: int  # tokens generated by this call
    seconds: float  # time this call spent generating


def answer_in_chunks(
    requests: list[list[int]],
    generate: Generate,
    data_dir: Path,
    temperatures: tuple[float, ...] = (0.0,),
    seed: int = 0,
    chunk: int = 32,
    budget_tokens: int | None = None,
    progress: bool = True,
) -> Answered:
    """Answer ``requests`` (prompt token ids) in chunks saved as ``data_dir/chunk_NNNNN.json`` as they complete:
    an interrupted run continues where it stopped, a run with a larger budget extends the chunk it cut short.

    Request j is answered at ``temperatures[j % n]`` with seed :func:`answer_seed` ``(seed, j)``; the budget (tokens
    of all answers) is checked before each answer. The caller records the plan (:func:`check_plan`).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    done = Answered([], 0, 0, 0.0)

    def over_budget() -> bool:
        return budget_tokens is not None and done.generated >= budget_tokens

    bar = progress_bar(len(requests), "answering", "answer", progress=progress)
    for c in range(0, -(-len(requests) // chunk)):
        block = requests[c * chunk : (c + 1) * chunk]
        path = data_dir / f"chunk_{c:05d}.json"
        answers = json.loads(path.read_text())["answers"] if path.exists() else []
        bar.update(len(answers))
        done.generated += sum(map(len, answers))
        if len(answers) < len(block) and not over_budget():  # a new chunk, or the rest of one cut by the budget
            t0 = time.perf_counter()
            while len(answers) < len(block) and not over_budget():
                j = c * chunk + len(answers)
                answer = generate(block[len(answers)], temperatures[j % len(temperatures)], answer_seed(seed, j))
                answers.append(answer)
                done.generated += len(answer)
                done.this_run += len(answer)
                bar.update(1)
                rate = done.this_run / max(done.seconds + time.perf_counter() - t0, 1e-9)
                bar.set_postfix(tokens=done.generated, tok_s=f"{rate:.0f}")
            done.seconds += time.perf_counter() - t0
            write_json_atomic(path, {"answers": answers})
        done.chunks.append(answers)
        if len(answers) < len(block):
            break
    bar.close()
    return done


# ----------------------------------------------------------------------------------------------- command line


HELPS = {
    "target": "default | a .gguf file | a model directory | a hub id",
    "prompts_dir": 'directory of *.prompts.jsonl files, one {"prompt": "..."} object a line (default: '
    "$SPECWISE_PROMPTS, else the 300 prompts shipped with specwise)",
    "data_dir": "cache of the target's answers (default: under the cache)",
    "gsm8k_limit": "rows of gsm8k_train.prompts.jsonl to use where the prompts directory has it, sampled (default: "
    "1000)",
    "max_prompts": "answer at most this many prompts (default: all)",
    "corpus_dir": "directory of plain-text *.txt files (paragraphs separated by blank lines) for --passages",
    "passages": "also have the target answer this many tasks on --corpus-dir passages (summarise, ...; default: 0)",
    "self_prompts": "also have the target write this many user requests itself and answer them (default: 0)",
}


def add_arguments(p: argparse.ArgumentParser, *, out_help: str, max_new_tokens: int, **helps: str) -> None:
    """The arguments of :class:`AnswerOptions` (``--seed``, ``--device``, ``--no-progress`` among them); ``helps``
    replaces the help of a shared one (by its option's name with underscores) where a command says more."""
    unknown = set(helps) - set(HELPS)
    if unknown:
        raise TypeError(f"no shared argument {sorted(unknown)}")
    h = {**HELPS, **helps}
    p.add_argument("--target", default="default", help=h["target"])
    p.add_argument("--out", required=True, type=Path, help=out_help)
    p.add_argument("--prompts-dir", type=Path, default=None, help=h["prompts_dir"])
    p.add_argument("--data-dir", type=Path, default=None, help=h["data_dir"])
    p.add_argument("--gsm8k-limit", type=int, default=1000, help=h["gsm8k_limit"])
    p.add_argument("--max-prompts", type=int, default=None, help=h["max_prompts"])
    p.add_argument("--corpus-dir", type=Path, default=None, help=h["corpus_dir"])
    p.add_argument("--passages", type=int, default=0, help=h["passages"])
    p.add_argument("--self-prompts", type=int, default=0, help=h["self_prompts"])
    p.add_argument(
        "--max-new-tokens", type=int, default=max_new_tokens, help=f"answer length cap (default: {max_new_tokens})"
    )
    p.add_argument("--seed", type=int, default=0, help="(default: 0)")
    p.add_argument("--device", default="cpu", help="cpu | cuda (default: cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def answer_options(args: argparse.Namespace) -> dict:
    """The :class:`AnswerOptions` fields of parsed :func:`add_arguments` arguments (checked), as keywords."""
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    for name in ("passages", "self_prompts", "gsm8k_limit"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    limits = default_prompt_limits()
    limits[GSM8K] = args.gsm8k_limit
    return {
        "target": args.target,
        "out": args.out,
        "data_dir": args.data_dir,
        "prompts_dir": resolve_prompts_dir(args.prompts_dir),
        "prompt_limits": limits,
        "corpus_dir": args.corpus_dir,
        "passages": args.passages,
        "self_prompts": args.self_prompts,
        "max_prompts": args.max_prompts,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "device": args.device,
        "progress": not args.no_progress,
    }


def record_command() -> None:
    """Keep the command line (``SPECWISE_COMMAND``) for the metadata of what the run writes."""
    os.environ.setdefault("SPECWISE_COMMAND", "specwise " + shlex.join(sys.argv[1:]))
