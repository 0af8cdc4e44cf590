"""The benchmark runner: every configuration on every prompt, interleaved, with plain decoding and Hugging Face
``generate`` as baselines, Hugging Face assisted generation as the peer, and llama.cpp on the same GGUF file.

Each round runs every configuration on every prompt (and seed): back to back, in an order rotated from one prompt
and round to the next, so that slow drifts of the machine (other processes, heat) fall on every configuration
alike. One warm-up run of each configuration comes first and is not recorded.

By default every run generates exactly ``max_new_tokens`` tokens: EOS is treated as an ordinary token
(``eos_token_ids=[]`` for the engine, ``eos_token_id=[]`` for Hugging Face), so all methods do the same amount of
work and greedy outputs can be compared token for token. ``stop_at_eos`` honours EOS instead.

Statistics come from :mod:`specwise.metrics`; speedups are ratios of median tokens/s over the same runs, and
paired speedups with 95% intervals and verdicts come from :mod:`specwise.bench.paired`.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from specwise.bench.paired import paired_speedups
from specwise.bench.prompts import BenchPrompt
from specwise.engine import Engine
from specwise.machine import cpu_generation, cpu_name, vector_flags
from specwise.metrics import SpecStats
from specwise.sampling import SamplingParams

__all__ = [
    "emit_json",
    "SCHEMA_VERSION",
    "PLAIN_ID",
    "HF_GENERATE_ID",
    "LLAMA_CPP_ID",
    "BenchConfig",
    "BenchSettings",
    "Outcome",
    "RunRecord",
    "make_configs",
    "paired_summary",
    "run_bench",
    "summarize",
    "validate_results",
]

SCHEMA_VERSION = 2
SPECWISE = "specwise"
HF_GENERATE = "hf_generate"
HF_ASSISTED = "hf_assisted"
LLAMA_CPP = "llama_cpp"
PLAIN_ID = "specwise:none"
HF_GENERATE_ID = "hf_generate"
LLAMA_CPP_ID = "llama_cpp"
WARMUP_TOKENS = 16
_PEER_KINDS = ("ngram", "model")  # drafters that Hugging Face assisted generation can mirror


@dataclass(frozen=True)
class BenchConfig:
    """One way of decoding: the method (``specwise``, ``hf_generate``, ``hf_assisted``, ``llama_cpp``), drafter and
    gamma (an integer, or ``auto``: the planner's choice per step)."""

    method: str
    drafter: str = "none"
    gamma: int | str = 0

    @property
    def id(self) -> str:
        """A unique, stable name, e.g. ``specwise:none``, ``specwise:ngram:g4``, ``hf_assisted:ngram:g4``."""
        if self.method in (HF_GENERATE, LLAMA_CPP):
            return self.method
        if self.method == SPECWISE and self.drafter == "none":
            return PLAIN_ID
        return f"{self.method}:{self.drafter}:g{self.gamma}"

    @property
    def label(self) -> str:
        """A short human-readable name for tables and plots."""
        if self.method == HF_GENERATE:
            return "HF generate"
        if self.method == LLAMA_CPP:
            return "llama.cpp"
        if self.method == SPECWISE and self.drafter == "none":
            return "specwise plain"
        prefix = "specwise" if self.method == SPECWISE else "HF assisted"
        return f"{prefix} {_short_drafter(self.drafter)} γ={self.gamma}"

    def to_dict(self) -> dict:
        return {"id": self.id, "label": self.label, "method": self.method, "drafter": self.drafter, "gamma": self.gamma}


def _short_drafter(spec: str) -> str:
    kind, _, arg = spec.partition(":")
    if kind == "model" and arg:
        return f"model:{os.path.basename(arg.rstrip('/')) or arg}"
    return spec


@dataclass
class BenchSettings:
    """What to run. ``drafters`` and ``gammas`` span the speculative configurations (``none`` is always run).

    ``rounds``: how many times every configuration runs on every prompt and seed. ``llama_cpp``: run llama.cpp on
    the target's GGUF file as a peer (None: no; ``""``: the binaries found by ``find_llama_cpp``; else their
    folder). ``precision``: the target's numerics (``q8``/``exact``; None: the loader's default).
    """

    target: str = "default"
    device: str = "cpu"
    drafters: list[str] = field(default_factory=lambda: ["ngram"])
    gammas: list[int | str] = field(default_factory=lambda: [4])
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seeds: list[int] = field(default_factory=lambda: [0])
    hf_baselines: bool = True
    stop_at_eos: bool = False
    chat: bool = True
    warmup: bool = True
    prompt_source: str = "specwise-default"
    categories: list[str] = field(default_factory=list)
    limit_per_category: int | None = None
    rounds: int = 1
    llama_cpp: str | None = None
    precision: str | None = None

    def params(self, seed: int) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p, seed)

    def check(self) -> None:
        """Raise ValueError on settings that cannot run."""
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not self.gammas or not all(g == "auto" or (_is_int(g) and g >= 1) for g in self.gammas):
            raise ValueError(f"gammas must be integers >= 1 or 'auto', got {self.gammas}")
        if not self.seeds:
            raise ValueError("give at least one seed")
        if not _is_int(self.rounds) or self.rounds < 1:
            raise ValueError(f"rounds must be an integer >= 1, got {self.rounds!r}")
        if self.llama_cpp is not None:
            if self.temperature != 0.0 or self.stop_at_eos:
                raise ValueError(
                    "the llama.cpp peer decodes greedily with EOS ignored: drop --temperature/--stop-at-eos"
                )
            if not str(self.device).startswith("cpu"):
                raise ValueError(f"the llama.cpp peer runs on the CPU: use --device cpu (got {self.device})")
        self.params(self.seeds[0])  # validates the sampling settings

    def to_dict(self) -> dict:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["greedy"] = self.temperature == 0.0
        data["fixed_length"] = not self.stop_at_eos
        return data


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def make_configs(
    drafters: list[str], gammas: list[int | str], hf_baselines: bool, llama_cpp: bool = False
) -> list[BenchConfig]:
    """Plain decoding, each drafter at each gamma, then (with ``hf_baselines``) HF generate and the HF peers (at the
    integer gammas: assisted generation has no per-step planner), then (with ``llama_cpp``) llama.cpp."""
    specs = [d for d in dict.fromkeys(drafters) if d != "none"]
    gammas = list(dict.fromkeys(gammas))
    configs = [BenchConfig(SPECWISE)]
    configs += [BenchConfig(SPECWISE, d, g) for d in specs for g in gammas]
    if hf_baselines:
        configs.append(BenchConfig(HF_GENERATE))
        peers = [d for d in specs if d.partition(":")[0] in _PEER_KINDS]
        configs += [BenchConfig(HF_ASSISTED, d, g) for d in peers for g in gammas if _is_int(g)]
    if llama_cpp:
        configs.append(BenchConfig(LLAMA_CPP))
    return configs


# ---------------------------------------------------------------------------------------------------- running


@dataclass
class Outcome:
    """What one run produced: the new tokens, wall seconds (prefill included) and, for specwise, its SpecStats.

    ``decode_seconds``: the seconds after the prompt's pass, where the method reports them (llama.cpp's own
    ``eval time``); specwise's come from its stats. ``new_tokens``: the count, where ``token_ids`` are not known
    while the run is timed (llama.cpp: they are filled in afterwards).
    """

    token_ids: list[int]
    seconds: float
    finish_reason: str
    target_passes: int
    stats: SpecStats | None = None
    decode_seconds: float | None = None
    new_tokens: int | None = None

    @property
    def count(self) -> int:
        """The number of new tokens."""
        return self.new_tokens if self.new_tokens is not None else len(self.token_ids)

    @property
    def tokens_per_second(self) -> float:
        if self.stats is not None:
            return self.stats.tokens_per_second
        return self.count / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float | None:
        """New tokens per second after the prompt's pass (prefill excluded, as llama.cpp counts), where known."""
        decode = self.decode_seconds
        if decode is None and self.stats is not None:
            decode = self.stats.total_seconds - self.stats.prefill_seconds
        return self.count / decode if decode else None


class SpecwiseRunner:
    """Runs one configuration through the specwise Engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def run(self, prompt_ids: list[int], params: SamplingParams, max_new_tokens: int, eos: list[int]) -> Outcome:
        result = self.engine.generate(prompt_ids, params, max_new_tokens, eos_token_ids=eos)
        stats = result.stats
        return Outcome(result.token_ids, stats.total_seconds, result.finish_reason, stats.target_passes, stats)


def hf_module(model, what: str):
    """The transformers module behind a specwise Model (the HF adapter's ``.model``, a native model's
    ``.hf_model``), for the Hugging Face baselines; a clear error when there is none."""
    from transformers import PreTrainedModel

    for name in ("model", "hf_model"):
        module = getattr(model, name, None)
        if isinstance(module, PreTrainedModel):
            return module
    reference = getattr(model, "hf_reference", None)  # a quantized model: the float32 model of the same file
    if callable(reference):
        return reference()
    raise ValueError(
        f"the {what} ({type(model).__name__}) is not backed by a Hugging Face model, so the Hugging Face "
        "baselines cannot run with the same weights: pass --no-hf to skip them"
    )


class PassCounter:
    """Counts forward calls of a module (the target passes of Hugging Face ``generate``)."""

    def __init__(self, module) -> None:
        self.count = 0
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, *_args) -> None:
        self.count += 1

    def remove(self) -> None:
        """Take the hook off the module."""
        self._handle.remove()


class HFRunner:
    """Runs Hugging Face ``generate`` on the target's own module, plain or assisted (the peer).

    Target passes are counted with a forward hook, so tau (tokens per target pass) is measured for the peer too.
    """

    def __init__(
        self, module, counter: PassCounter, pad_token_id: int, assistant=None, gamma: int = 0, lookup_ngram: int = 0
    ) -> None:
        self.module = module
        self.counter = counter
        self.pad_token_id = pad_token_id
        self.assistant = assistant
        self.gamma = gamma
        self.lookup_ngram = lookup_ngram

    def _peer_kwargs(self) -> dict:
        if self.lookup_ngram:
            return {"prompt_lookup_num_tokens": self.gamma, "max_matching_ngram_size": self.lookup_ngram}
        if self.assistant is None:
            return {}
        config = self.assistant.generation_config  # draft exactly gamma tokens per step, as specwise does
        config.num_assistant_tokens = self.gamma
        config.num_assistant_tokens_schedule = "constant"
        config.assistant_confidence_threshold = 0.0
        return {"assistant_model": self.assistant}

    @staticmethod
    def _sampling_kwargs(params: SamplingParams) -> dict:
        """The same distribution as specwise's; a repetition penalty from the model's generation config is undone."""
        if params.greedy:
            return {"do_sample": False, "repetition_penalty": 1.0}
        if params.seed is not None:
            torch.manual_seed(params.seed)
        return {
            "do_sample": True,
            "repetition_penalty": 1.0,
            "temperature": params.temperature,
            "top_k": params.top_k,  # 0 disables it, as in specwise
            "top_p": params.top_p,
            "min_p": params.min_p or None,
        }

    def run(self, prompt_ids: list[int], params: SamplingParams, max_new_tokens: int, eos: list[int]) -> Outcome:
        device = next(self.module.parameters()).device
        input_ids = torch.tensor([prompt_ids], device=device)
        kwargs = {**self._peer_kwargs(), **self._sampling_kwargs(params)}
        self.counter.count = 0
        start = time.perf_counter()
        with torch.inference_mode():
            output = self.module.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new_tokens,
                eos_token_id=list(eos),
                pad_token_id=self.pad_token_id,
                **kwargs,
            )
        seconds = time.perf_counter() - start
        new = output[0, len(prompt_ids) :].tolist()
        finish = "stop" if new and new[-1] in eos else "length"
        return Outcome(new, seconds, finish, self.counter.count)


class LlamaCppRunner:
    """Runs ``llama-completion`` (llama.cpp's command-line program) greedily on the target's GGUF file, EOS
    ignored, on the prompt's text (the prompt ids decoded with special tokens, which llama.cpp parses back).

    Its tokens/s is its own report's decode rate (``eval time``: model loading and the prompt's pass are not
    counted); the token ids come afterwards from ``llama-server`` (:func:`llama_cpp_tokens`, untimed).
    """

    def __init__(self, gguf, tokenizer, threads: int) -> None:
        self.gguf, self.tokenizer, self.threads = gguf, tokenizer, threads

    def run(self, prompt_ids: list[int], params: SamplingParams, max_new_tokens: int, eos: list[int]) -> Outcome:
        from specwise.bench.llamacpp import completion_decode

        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        out = completion_decode(self.gguf, text, max_new_tokens, self.threads)
        seconds = max_new_tokens / out["decode_tokens_per_s"]
        return Outcome([], seconds, "length", max_new_tokens, decode_seconds=seconds, new_tokens=max_new_tokens)


def llama_cpp_tokens(gguf, prompts: dict[str, list[int]], max_new_tokens: int, threads: int) -> dict[str, list[int]]:
    """llama.cpp's greedy tokens for each prompt's ids (one ``llama-server`` for all; untimed), EOS ignored."""
    from specwise.bench.llamacpp import LlamaServer

    with LlamaServer(gguf, threads=threads, ctx_size=4096) as server:
        return {pid: server.greedy(ids, max_new_tokens)["token_ids"] for pid, ids in prompts.items()}


def llama_cpp_info(gguf, max_new_tokens: int, threads: int) -> dict:
    """Where llama.cpp came from and its own ``llama-bench`` decode figure (``tg``, 3 repetitions) on the file."""
    from specwise.bench.llamacpp import find_llama_cpp, llama_bench

    return {
        "binaries": str(find_llama_cpp()),
        "gguf": str(gguf),
        "threads": threads,
        "llama_bench_tg": llama_bench(gguf, n_gen=max_new_tokens, threads=threads, repetitions=3),
    }


Runner = SpecwiseRunner | HFRunner | LlamaCppRunner


def _pad_token_id(tokenizer) -> int:
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    return 0


def build_runners(
    configs: list[BenchConfig], loaded, device: str, gguf=None, precision: str | None = None
) -> dict[str, Runner]:
    """One runner per configuration; drafters are built once per spec and shared across gammas.

    gguf: the target's GGUF file (for the llama.cpp peer). precision: the drafters' numerics (None: the default).
    """
    from specwise.drafters import make_drafter
    from specwise.runtime import saved_cost_prior

    drafters: dict = {}
    runners: dict[str, Runner] = {}
    counter = None
    extra = {} if precision is None else {"precision": precision}
    cost_prior = saved_cost_prior(loaded, device)  # the adaptive planner's, as build_runtime gives it
    for config in configs:
        if config.method == LLAMA_CPP:
            if gguf is None:
                raise ValueError("the llama.cpp peer needs a GGUF target: --target default or a .gguf file")
            runners[config.id] = LlamaCppRunner(gguf, loaded.tokenizer, torch.get_num_threads())
            continue
        if config.method == SPECWISE:
            if config.drafter not in drafters:
                drafters[config.drafter] = make_drafter(config.drafter, loaded, device=device, **extra)
            engine = Engine(
                loaded.model, drafters[config.drafter], config.gamma, loaded.tokenizer, cost_curve=cost_prior
            )
            runners[config.id] = SpecwiseRunner(engine)
            continue
        module = hf_module(loaded.model, "target")
        counter = counter or PassCounter(module)
        runners[config.id] = _hf_runner(config, module, counter, _pad_token_id(loaded.tokenizer), drafters)
    return runners


def _hf_runner(config: BenchConfig, module, counter: PassCounter, pad: int, drafters: dict) -> HFRunner:
    if config.method == HF_GENERATE:
        return HFRunner(module, counter, pad)
    drafter = drafters[config.drafter]
    if config.drafter.partition(":")[0] == "ngram":
        return HFRunner(module, counter, pad, gamma=config.gamma, lookup_ngram=drafter.max_ngram)
    assistant = hf_module(getattr(drafter, "model", None), f"draft model of {config.drafter!r}")
    return HFRunner(module, counter, pad, assistant=assistant, gamma=config.gamma)


@dataclass
class RunRecord:
    """One measured run of one configuration on one prompt and seed."""

    config: BenchConfig
    prompt: BenchPrompt
    seed: int
    order: int  # position of this configuration in the prompt's rotated order
    outcome: Outcome
    round: int = 0
    identical_to_plain: bool | None = None  # greedy only: token ids equal the plain engine's for this prompt
    first_difference: int | None = None  # index of the first differing token, when not identical

    def to_dict(self) -> dict:
        out = self.outcome
        return {
            "config": self.config.id,
            "method": self.config.method,
            "prompt_id": self.prompt.id,
            "category": self.prompt.category,
            "seed": self.seed,
            "round": self.round,
            "order": self.order,
            "new_tokens": out.count,
            "seconds": out.seconds,
            "tokens_per_second": out.tokens_per_second,
            "decode_tokens_per_second": out.decode_tokens_per_second,
            "target_passes": out.target_passes,
            "finish_reason": out.finish_reason,
            "identical_to_plain": self.identical_to_plain,
            "first_difference": self.first_difference,
            "stats": out.stats.to_dict() if out.stats is not None else None,
        }


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _rotate(items: list, shift: int) -> list:
    shift %= len(items)
    return items[shift:] + items[:shift]


class _Job:
    """Everything one run needs besides the configuration."""

    def __init__(self, settings: BenchSettings, runners: dict[str, Runner], eos: list[int], bar) -> None:
        self.settings, self.runners, self.eos, self.bar = settings, runners, eos, bar

    def run(self, config: BenchConfig, prompt_ids: list[int], seed: int, max_new_tokens: int) -> Outcome:
        self.bar.set_postfix_str(config.label, refresh=False)
        outcome = self.runners[config.id].run(prompt_ids, self.settings.params(seed), max_new_tokens, self.eos)
        self.bar.update()
        return outcome


def _run_prompt(
    job: _Job, order: list[BenchConfig], prompt: BenchPrompt, ids: list[int], seed: int, round_: int = 0
) -> list[RunRecord]:
    """Every configuration on one prompt, back to back in ``order``; greedy outputs are compared with plain
    (llama.cpp's later, once its tokens are known: :func:`_check_llama_cpp`)."""
    outcomes = {c.id: job.run(c, ids, seed, job.settings.max_new_tokens) for c in order}
    plain = outcomes[PLAIN_ID].token_ids
    greedy = job.settings.temperature == 0.0
    records = []
    for position, config in enumerate(order):
        record = RunRecord(config, prompt, seed, position, outcomes[config.id], round_)
        if greedy and config.id not in (PLAIN_ID, LLAMA_CPP_ID):
            _compare(record, plain)
        records.append(record)
    return records


def _compare(record: RunRecord, plain: list[int]) -> None:
    record.first_difference = _first_difference(record.outcome.token_ids, plain)
    record.identical_to_plain = record.first_difference is None
    if record.config.method == SPECWISE and not record.identical_to_plain:
        _warn_mismatch(record)


def _check_llama_cpp(records: list[RunRecord], tokens: dict[str, list[int]]) -> None:
    """Give llama.cpp's records their token ids and compare them with plain decoding of the same round."""
    plain = {(r.prompt.id, r.seed, r.round): r.outcome.token_ids for r in records if r.config.id == PLAIN_ID}
    for r in records:
        if r.config.id == LLAMA_CPP_ID:
            r.outcome.token_ids = tokens[r.prompt.id]
            _compare(r, plain[(r.prompt.id, r.seed, r.round)])


def _warn_mismatch(record: RunRecord) -> None:
    from tqdm import tqdm

    tqdm.write(
        f"specwise bench: GREEDY MISMATCH: {record.config.label} differs from plain greedy decoding on prompt "
        f"{record.prompt.id} (seed {record.seed}) from token {record.first_difference}: speculative decoding "
        "must reproduce plain greedy output exactly",
        file=sys.stderr,
    )


def _eos_ids(settings: BenchSettings, loaded) -> list[int]:
    """The end tokens the engine would use (generation config and tokenizer), or none without --stop-at-eos."""
    from specwise.runtime import eos_ids

    return sorted(eos_ids(loaded) or []) if settings.stop_at_eos else []


def run_bench(
    settings: BenchSettings,
    prompts: list[BenchPrompt],
    loaded=None,
    progress: bool = True,
    command: str = "",
) -> dict:
    """Run the benchmark and return the results (the ``results.json`` object, see docs/BENCHMARKS.md).

    loaded: the target as a LoadedModel (loaded from ``settings.target`` when None).

    Round r runs every configuration on every prompt and seed; job j of the round (a prompt and seed) starts at
    configuration r + j of the list and goes round it, so each configuration takes every place in the order.
    """
    from tqdm import tqdm

    from specwise.runtime import encode_prompt

    settings.check()
    _check_prompts(prompts)
    if loaded is None:
        from specwise.models import load_model

        extra = {} if settings.precision is None else {"precision": settings.precision}
        loaded = load_model(settings.target, device=settings.device, **extra)
    gguf = _llama_cpp_file(settings)
    configs = make_configs(settings.drafters, settings.gammas, settings.hf_baselines, gguf is not None)
    runners = build_runners(configs, loaded, settings.device, gguf, settings.precision)
    encoded = {p.id: encode_prompt(loaded.tokenizer, p.text, chat=settings.chat) for p in prompts}
    machine = machine_info(settings.device)
    jobs = [(p, seed) for p in prompts for seed in settings.seeds]
    total = len(configs) * (len(jobs) * settings.rounds + int(settings.warmup))
    records: list[RunRecord] = []
    bar = tqdm(total=total, desc="bench", unit="run", file=sys.stderr, disable=not progress, dynamic_ncols=True)
    try:
        job = _Job(settings, runners, _eos_ids(settings, loaded), bar)
        if settings.warmup:
            first = encoded[prompts[0].id]
            for config in configs:
                job.run(config, first, settings.seeds[0], min(WARMUP_TOKENS, settings.max_new_tokens))
        for r in range(settings.rounds):
            for j, (prompt, seed) in enumerate(jobs):
                records += _run_prompt(job, _rotate(configs, r + j), prompt, encoded[prompt.id], seed, r)
    finally:
        bar.close()
        for runner in runners.values():
            if isinstance(runner, HFRunner):
                runner.counter.remove()
    machine["load_average_end"] = _load_average()
    peer = None
    if gguf is not None:  # untimed, after the measured runs
        threads = torch.get_num_threads()
        _check_llama_cpp(records, llama_cpp_tokens(gguf, encoded, settings.max_new_tokens, threads))
        peer = llama_cpp_info(gguf, settings.max_new_tokens, threads)
    results = assemble_results(settings, loaded, configs, prompts, encoded, records, machine, command)
    results["llama_cpp"] = peer
    return results


def _llama_cpp_file(settings: BenchSettings):
    """The GGUF file llama.cpp runs (None without the peer); points ``find_llama_cpp`` at a given folder."""
    if settings.llama_cpp is None:
        return None
    from specwise.bench.llamacpp import ENV_VAR, find_llama_cpp
    from specwise.models.loader import gguf_source

    if settings.llama_cpp:
        os.environ[ENV_VAR] = str(settings.llama_cpp)
    if find_llama_cpp() is None:
        raise FileNotFoundError(
            f"llama.cpp binaries not found (in ${ENV_VAR} or ~/.cache/specwise-peers/llama.cpp/bin): build them "
            "as specwise/bench/llamacpp.py describes, or pass their folder: --llama-cpp PATH"
        )
    gguf = gguf_source(settings.target)
    if gguf is None:
        raise ValueError(f"the llama.cpp peer needs a GGUF target (default or a .gguf file), got {settings.target!r}")
    return gguf


def _check_prompts(prompts: list[BenchPrompt]) -> None:
    if not prompts:
        raise ValueError("no prompts to run")
    ids = [p.id for p in prompts]
    duplicate = next((i for i in ids if ids.count(i) > 1), None)
    if duplicate is not None:
        raise ValueError(f"prompt id {duplicate!r} appears twice: prompt ids must be unique")


# ---------------------------------------------------------------------------------------------------- results


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _kernel_isa() -> str | None:
    from specwise.models.kernels.quant import isa, quantized_available

    return isa() if quantized_available() else None


def script_header(argv: list[str] | None, device: str = "cpu") -> dict:
    """What every benchmark script's JSON starts with: the command that made it, the date and the machine."""
    args = argv if argv is not None else sys.argv[1:]
    return {
        "command": " ".join(["python", Path(sys.argv[0]).name, *args]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine_info(device),
    }


def emit_json(result: dict, out: str | None) -> None:
    """A benchmark script's result: written to ``out`` as indented JSON, or printed when no file is named."""
    if out:
        with open(out, "w") as fh:
            json.dump(result, fh, indent=1)
    else:
        print(json.dumps(result, indent=1))


def machine_info(device: str) -> dict:
    """Where the benchmark ran: hardware, software versions, threads and load."""
    import transformers

    import specwise

    device_name = torch.cuda.get_device_name(device) if str(device).startswith("cuda") else cpu_name()
    return {
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_generation": cpu_generation(),
        "cpu_flags": vector_flags(),
        "kernel_isa": _kernel_isa(),
        "cpu_count": os.cpu_count() or 0,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "specwise": specwise.__version__,
        "device": str(device),
        "device_name": device_name,
        "torch_threads": torch.get_num_threads(),
        "load_average_start": _load_average(),
        "load_average_end": None,
    }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _summary_entry(config: BenchConfig, category: str, runs: list[RunRecord], medians: dict) -> dict:
    """Statistics of one configuration over one category's runs (``all``: every run)."""
    tps = medians[config.id]
    peer = config.method == LLAMA_CPP  # decode tokens/s only: paired against specwise in "paired" instead
    decode = [r.outcome.decode_tokens_per_second for r in runs]
    new = sum(r.outcome.count for r in runs)
    passes = sum(r.outcome.target_passes for r in runs)
    checked = [r.identical_to_plain for r in runs if r.identical_to_plain is not None]
    entry = {
        "config": config.id,
        "category": category,
        "runs": len(runs),
        "new_tokens": new,
        "target_passes": passes,
        "tokens_per_second_median": tps,
        "decode_tokens_per_second_median": _median([d for d in decode if d is not None]),
        "speedup_vs_plain": None if peer else _ratio(tps, medians.get(PLAIN_ID)),
        "speedup_vs_hf_generate": None if peer else _ratio(tps, medians.get(HF_GENERATE_ID)),
        "acceptance_rate": None,
        "mean_accepted_length": new / passes if passes else None,
        "expected_mean_accepted_length": None,
        "acceptance_by_position": None,
        "greedy_identical": all(checked) if checked else None,
        "greedy_mismatches": checked.count(False),
        "stats": None,
    }
    stats = [r.outcome.stats for r in runs if r.outcome.stats is not None]
    if stats:
        merged = SpecStats()
        for s in stats:
            merged.merge(s)
        entry["mean_accepted_length"] = merged.mean_accepted_length
        entry["stats"] = merged.to_dict()
        if merged.drafted:
            entry["acceptance_rate"] = merged.acceptance_rate
            entry["expected_mean_accepted_length"] = merged.expected_mean_accepted_length
            entry["acceptance_by_position"] = merged.acceptance_by_position
    return entry


def summarize(configs: list[BenchConfig], records: list[RunRecord], categories: list[str]) -> list[dict]:
    """One entry per configuration and category, then per configuration over ``all`` categories."""
    entries = []
    for category in [*categories, "all"]:
        chosen = [r for r in records if category == "all" or r.prompt.category == category]
        by_config = {c.id: [r for r in chosen if r.config.id == c.id] for c in configs}
        medians = {cid: _median([r.outcome.tokens_per_second for r in runs]) for cid, runs in by_config.items()}
        entries += [_summary_entry(c, category, by_config[c.id], medians) for c in configs]
    return entries


def _baselines(config: BenchConfig, ids: set[str]) -> list[tuple[str, str]]:
    """(baseline, measure) pairs a configuration is compared with: the plain decoding of its own engine (end to
    end, and on decode tokens/s: the prompt's pass, which speculation does not change, left out), then the peers'
    plain decoding (Hugging Face generate; llama.cpp on decode tokens/s, as it reports them)."""
    if config.method == HF_ASSISTED:
        return [(HF_GENERATE_ID, "tokens_per_second")]
    if config.method != SPECWISE:
        return []
    pairs = [] if config.id == PLAIN_ID else [(PLAIN_ID, "tokens_per_second"), (PLAIN_ID, "decode_tokens_per_second")]
    if HF_GENERATE_ID in ids:
        pairs.append((HF_GENERATE_ID, "tokens_per_second"))
    if LLAMA_CPP_ID in ids:
        pairs.append((LLAMA_CPP_ID, "decode_tokens_per_second"))
    return pairs


def paired_summary(configurations: list[dict], runs: list[dict], categories: list[str]) -> list[dict]:
    """Paired speedups (95% intervals, verdicts) of every configuration over its baselines, per category and over
    ``all``, from the results' configurations and run records (see :mod:`specwise.bench.paired`)."""
    configs = [BenchConfig(c["method"], c["drafter"], c["gamma"]) for c in configurations]
    ids = {c.id for c in configs}
    entries = []
    for config in configs:
        for baseline, measure in _baselines(config, ids):
            entries += paired_speedups(runs, config.id, baseline, categories, measure)
    return entries


def greedy_check(records: list[RunRecord], greedy: bool) -> dict:
    """Whether every greedy speculative output equals plain greedy output, and how often the HF runs agree."""

    def agreement(method: str) -> dict | None:
        runs = [r for r in records if r.config.method == method and r.identical_to_plain is not None]
        return {"identical": sum(r.identical_to_plain for r in runs), "total": len(runs)} if runs else None

    checked = [r for r in records if r.config.method == SPECWISE and r.identical_to_plain is not None]
    mismatches = [
        {"config": r.config.id, "prompt_id": r.prompt.id, "seed": r.seed, "first_difference": r.first_difference}
        for r in checked
        if not r.identical_to_plain
    ]
    return {
        "greedy": greedy,
        "checked_runs": len(checked),
        "all_identical": not mismatches if greedy else None,
        "mismatches": mismatches,
        "hf_generate_identical": agreement(HF_GENERATE),
        "hf_assisted_identical": agreement(HF_ASSISTED),
        "llama_cpp_identical": agreement(LLAMA_CPP),
    }


def _prompt_entries(prompts: list[BenchPrompt], encoded: dict, records: list[RunRecord], tokenizer) -> list[dict]:
    plain = {}
    for r in records:
        if r.config.id == PLAIN_ID and r.prompt.id not in plain:
            plain[r.prompt.id] = r.outcome.token_ids
    return [
        {
            "id": p.id,
            "category": p.category,
            "prompt_tokens": len(encoded[p.id]),
            "plain_text": tokenizer.decode(plain.get(p.id, []), skip_special_tokens=True),
        }
        for p in prompts
    ]


def assemble_results(
    settings: BenchSettings,
    loaded,
    configs: list[BenchConfig],
    prompts: list[BenchPrompt],
    encoded: dict,
    records: list[RunRecord],
    machine: dict,
    command: str,
) -> dict:
    """The ``results.json`` object."""
    categories = list(dict.fromkeys(p.category for p in prompts))
    runs = [r.to_dict() for r in records]
    configurations = [c.to_dict() for c in configs]
    return {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "machine": machine,
        "settings": {
            **settings.to_dict(),
            "target_name": loaded.name,
            "model_class": type(loaded.model).__name__,
            "num_prompts": len(prompts),
        },
        "configurations": configurations,
        "categories": categories,
        "prompts": _prompt_entries(prompts, encoded, records, loaded.tokenizer),
        "runs": runs,
        "summary": summarize(configs, records, categories),
        "paired": paired_summary(configurations, runs, categories),
        "greedy_check": greedy_check(records, settings.temperature == 0.0),
        "llama_cpp": None,
    }


# ---------------------------------------------------------------------------------------------------- schema

_NONE = type(None)
_NUM = (int, float)
_OPT_NUM = (int, float, _NONE)

SCHEMA: dict[str, dict[str, tuple]] = {
    "results": {
        "schema_version": (int,),
        "created": (str,),
        "command": (str,),
        "machine": (dict,),
        "settings": (dict,),
        "configurations": (list,),
        "categories": (list,),
        "prompts": (list,),
        "runs": (list,),
        "summary": (list,),
        "paired": (list,),
        "greedy_check": (dict,),
        "llama_cpp": (dict, _NONE),
    },
    "machine": {
        "platform": (str,),
        "cpu": (str,),
        "cpu_count": (int,),
        "python": (str,),
        "torch": (str,),
        "transformers": (str,),
        "specwise": (str,),
        "device": (str,),
        "device_name": (str,),
        "torch_threads": (int,),
        "load_average_start": (list, _NONE),
        "load_average_end": (list, _NONE),
    },
    "settings": {
        "target": (str,),
        "target_name": (str,),
        "model_class": (str,),
        "device": (str,),
        "drafters": (list,),
        "gammas": (list,),
        "max_new_tokens": (int,),
        "temperature": _NUM,
        "top_k": (int,),
        "top_p": _NUM,
        "min_p": _NUM,
        "seeds": (list,),
        "greedy": (bool,),
        "hf_baselines": (bool,),
        "stop_at_eos": (bool,),
        "fixed_length": (bool,),
        "chat": (bool,),
        "warmup": (bool,),
        "prompt_source": (str,),
        "categories": (list,),
        "limit_per_category": (int, _NONE),
        "rounds": (int,),
        "llama_cpp": (str, _NONE),
        "precision": (str, _NONE),
        "num_prompts": (int,),
    },
    "configuration": {"id": (str,), "label": (str,), "method": (str,), "drafter": (str,), "gamma": (int, str)},
    "prompt": {"id": (str,), "category": (str,), "prompt_tokens": (int,), "plain_text": (str,)},
    "run": {
        "config": (str,),
        "method": (str,),
        "prompt_id": (str,),
        "category": (str,),
        "seed": (int,),
        "round": (int,),
        "order": (int,),
        "new_tokens": (int,),
        "seconds": _NUM,
        "tokens_per_second": _NUM,
        "decode_tokens_per_second": _OPT_NUM,
        "target_passes": (int,),
        "finish_reason": (str,),
        "identical_to_plain": (bool, _NONE),
        "first_difference": (int, _NONE),
        "stats": (dict, _NONE),
    },
    "summary": {
        "config": (str,),
        "category": (str,),
        "runs": (int,),
        "new_tokens": (int,),
        "target_passes": (int,),
        "tokens_per_second_median": _OPT_NUM,
        "decode_tokens_per_second_median": _OPT_NUM,
        "speedup_vs_plain": _OPT_NUM,
        "speedup_vs_hf_generate": _OPT_NUM,
        "acceptance_rate": _OPT_NUM,
        "mean_accepted_length": _OPT_NUM,
        "expected_mean_accepted_length": _OPT_NUM,
        "acceptance_by_position": (list, _NONE),
        "greedy_identical": (bool, _NONE),
        "greedy_mismatches": (int,),
        "stats": (dict, _NONE),
    },
    "greedy_check": {
        "greedy": (bool,),
        "checked_runs": (int,),
        "all_identical": (bool, _NONE),
        "mismatches": (list,),
        "hf_generate_identical": (dict, _NONE),
        "hf_assisted_identical": (dict, _NONE),
        "llama_cpp_identical": (dict, _NONE),
    },
    "paired": {
        "config": (str,),
        "baseline": (str,),
        "category": (str,),
        "measure": (str,),
        "questions": (int,),
        "pairs": (int,),
        "geomean": _OPT_NUM,
        "low": _OPT_NUM,
        "high": _OPT_NUM,
        "verdict": (str,),
    },
    "llama_cpp": {"binaries": (str,), "gguf": (str,), "threads": (int,), "llama_bench_tg": (dict,)},
}


def _type_ok(value, allowed: tuple) -> bool:
    if isinstance(value, bool):
        return bool in allowed
    return isinstance(value, allowed)


def _check_fields(obj, kind: str, where: str, errors: list[str]) -> None:
    if not isinstance(obj, dict):
        errors.append(f"{where}: expected an object, got {type(obj).__name__}")
        return
    for name, allowed in SCHEMA[kind].items():
        if name not in obj:
            errors.append(f"{where}: missing field {name!r}")
        elif not _type_ok(obj[name], allowed):
            names = " or ".join("null" if t is _NONE else t.__name__ for t in allowed)
            errors.append(f"{where}.{name}: expected {names}, got {type(obj[name]).__name__}")


def _check_references(data: dict, errors: list[str]) -> None:
    ids = {c.get("id") for c in data["configurations"] if isinstance(c, dict)}
    if PLAIN_ID not in ids:
        errors.append(f"configurations: the plain baseline {PLAIN_ID!r} is missing")
    prompt_ids = {p.get("id") for p in data["prompts"] if isinstance(p, dict)}
    for i, run in enumerate(data["runs"]):
        if isinstance(run, dict) and (run.get("config") not in ids or run.get("prompt_id") not in prompt_ids):
            errors.append(f"runs[{i}]: unknown configuration {run.get('config')!r} or prompt {run.get('prompt_id')!r}")
    have = {(s.get("config"), s.get("category")) for s in data["summary"] if isinstance(s, dict)}
    for category in [*data["categories"], "all"]:
        errors += [f"summary: no entry for {c!r} in category {category!r}" for c in ids if (c, category) not in have]


def validate_results(data) -> None:
    """Raise ValueError listing every way ``data`` departs from the results.json schema (docs/BENCHMARKS.md)."""
    errors: list[str] = []
    _check_fields(data, "results", "results", errors)
    if not errors:
        if data["schema_version"] != SCHEMA_VERSION:
            errors.append(f"schema_version is {data['schema_version']}, this specwise reads {SCHEMA_VERSION}")
        for kind in ("machine", "settings", "greedy_check"):
            _check_fields(data[kind], kind, kind, errors)
        for kind, key in (("configuration", "configurations"), ("prompt", "prompts"), ("run", "runs")):
            for i, item in enumerate(data[key]):
                _check_fields(item, kind, f"{key}[{i}]", errors)
        for kind, key in (("summary", "summary"), ("paired", "paired")):
            for i, item in enumerate(data[key]):
                _check_fields(item, kind, f"{key}[{i}]", errors)
        if data["llama_cpp"] is not None:
            _check_fields(data["llama_cpp"], "llama_cpp", "llama_cpp", errors)
        _check_references(data, errors)
    if errors:
        raise ValueError("results do not match the schema:\n  " + "\n  ".join(errors))
