"""The benchmark runner: every configuration on every prompt, interleaved, with plain decoding and Hugging Face
``generate`` as baselines, Hugging Face assisted generation as the peer, and llama.cpp on the same GGUF file.

Each round runs every configuration on every prompt (and seed): back to back, in an order rotated from one prompt
and round to the next, so that slow drifts of the machine (other processes, heat) fall on every configuration
alike. One warm-up run of each configuration comes first and is not recorded.

By default every run generates exactly ``max_new_tokens`` tokens: EOS is treated as an ordinary token
(``eos_token_ids=[]`` for the engine, ``eos_token_id=[]`` for Hugging Face), so all methods do the same amount of
work and greedy outputs can be compared token for token. ``stop_at_eos`` honours EOS instead.

Statistics come from :mod:`specwise.metrics`; speedups are ratios of median tokens/s over the same runs, and
paired speedups with 95% intervals and verdicts come from :mod:`specwise.lab.bench.paired`. What runs is
:mod:`specwise.lab.bench.configs`'; the records and ``results.json`` are :mod:`specwise.lab.bench.schema`'s; the machine
record is :mod:`specwise.lab.bench.environment`'s.
"""

from __future__ import annotations

import os
import sys
import time

from specwise.engine import Engine
from specwise.lab.bench.configs import (
    HF_GENERATE,
    HF_GENERATE_ID,
    LLAMA_CPP,
    LLAMA_CPP_ID,
    PLAIN_ID,
    SPECWISE,
    BenchConfig,
    BenchSettings,
    make_configs,
)
from specwise.lab.bench.environment import emit_json, load_average, machine_info, script_header
from specwise.lab.bench.memory import PeakMemory
from specwise.lab.bench.prompts import BenchPrompt
from specwise.lab.bench.schema import (
    SCHEMA,
    SCHEMA_VERSION,
    Outcome,
    RunRecord,
    assemble_results,
    paired_summary,
    summarize,
    validate_results,
)
from specwise.models.threads import get_num_threads
from specwise.sampling import SamplingParams

# Importable from here as before the split (benchmark scripts use script_header, emit_json and machine_info; the
# configurations, records and schema have their own modules: configs.py, schema.py, environment.py).
__all__ = [
    "emit_json",
    "script_header",
    "machine_info",
    "SCHEMA",
    "SCHEMA_VERSION",
    "PLAIN_ID",
    "HF_GENERATE_ID",
    "LLAMA_CPP_ID",
    "BenchConfig",
    "BenchSettings",
    "Outcome",
    "RunRecord",
    "build_runners",
    "hf_module",
    "make_configs",
    "paired_summary",
    "run_bench",
    "summarize",
    "validate_results",
]

WARMUP_TOKENS = 16


# ---------------------------------------------------------------------------------------------------- running


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
    ``.hf_model``), for the Hugging Face baselines; a clear error when there is none (or no hf extra)."""
    from specwise.extras import require

    require("hf", "the Hugging Face baselines (--no-hf skips them)")
    from transformers import PreTrainedModel

    from specwise.models.hf import HFModel
    from specwise.models.native import NativeModel

    module = model.model if isinstance(model, HFModel) else model.hf_model if isinstance(model, NativeModel) else None
    if isinstance(module, PreTrainedModel):
        return module
    from specwise.models.loader import hf_reference

    reference = hf_reference(model)  # a quantized model: the float32 model of the same file
    if reference is not None:
        return reference
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
            import torch

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
        import torch  # the Hugging Face baselines run only where the hf extra is installed

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
        from specwise.lab.bench.llamacpp import completion_decode

        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        out = completion_decode(self.gguf, text, max_new_tokens, self.threads)
        seconds = max_new_tokens / out["decode_tokens_per_s"]
        return Outcome([], seconds, "length", max_new_tokens, decode_seconds=seconds, new_tokens=max_new_tokens)


def llama_cpp_tokens(gguf, prompts: dict[str, list[int]], max_new_tokens: int, threads: int) -> dict[str, list[int]]:
    """llama.cpp's greedy tokens for each prompt's ids (one ``llama-server`` for all; untimed), EOS ignored."""
    from specwise.lab.bench.llamacpp import LlamaServer

    with LlamaServer(gguf, threads=threads, ctx_size=4096) as server:
        return {pid: server.greedy(ids, max_new_tokens)["token_ids"] for pid, ids in prompts.items()}


def llama_cpp_info(gguf, max_new_tokens: int, threads: int) -> dict:
    """Where llama.cpp came from and its own ``llama-bench`` decode figure (``tg``, 3 repetitions) on the file."""
    from specwise.lab.bench.llamacpp import find_llama_cpp, llama_bench

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
            runners[config.id] = LlamaCppRunner(gguf, loaded.tokenizer, get_num_threads())
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
    sources = drafters[config.drafter]
    drafter = sources[0] if len(sources) == 1 else None  # Hugging Face's runners take one drafter
    if config.drafter.partition(":")[0] == "ngram":
        return HFRunner(module, counter, pad, gamma=config.gamma, lookup_ngram=drafter.max_ngram)
    from specwise.drafters.cross_vocab import CrossVocabDrafter
    from specwise.drafters.model import ModelDrafter

    model = drafter.model if isinstance(drafter, (ModelDrafter, CrossVocabDrafter)) else None
    assistant = hf_module(model, f"draft model of {config.drafter!r}")
    return HFRunner(module, counter, pad, assistant=assistant, gamma=config.gamma)


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _rotate(items: list, shift: int) -> list:
    shift %= len(items)
    return items[shift:] + items[:shift]


class _Job:
    """Everything one run needs besides the configuration; ``memory`` measures each run's peak resident memory."""

    def __init__(
        self, settings: BenchSettings, runners: dict[str, Runner], eos: list[int], bar, memory: PeakMemory
    ) -> None:
        self.settings, self.runners, self.eos, self.bar = settings, runners, eos, bar
        self.memory = memory

    def run(self, config: BenchConfig, prompt_ids: list[int], seed: int, max_new_tokens: int) -> Outcome:
        self.bar.set_postfix_str(config.label, refresh=False)
        self.memory.reset()
        outcome = self.runners[config.id].run(prompt_ids, self.settings.params(seed), max_new_tokens, self.eos)
        if config.method != LLAMA_CPP:  # llama.cpp runs in a process of its own
            outcome.peak_rss_mib = self.memory.peak_mib()
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
    memory = PeakMemory()
    bar = tqdm(total=total, desc="bench", unit="run", file=sys.stderr, disable=not progress, dynamic_ncols=True)
    try:
        job = _Job(settings, runners, _eos_ids(settings, loaded), bar, memory)
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
    machine["load_average_end"] = load_average()
    peer = None
    if gguf is not None:  # untimed, after the measured runs
        threads = get_num_threads()
        _check_llama_cpp(records, llama_cpp_tokens(gguf, encoded, settings.max_new_tokens, threads))
        peer = llama_cpp_info(gguf, settings.max_new_tokens, threads)
    results = assemble_results(settings, loaded, configs, prompts, encoded, records, machine, command, memory.record())
    results["llama_cpp"] = peer
    for config in results["configurations"]:
        config["cross_vocabulary"] = _cross_vocabulary(runners.get(config["id"]))
    return results


def _cross_vocabulary(runner) -> dict | None:
    """A configuration's draft model of another vocabulary, as ``CrossVocabDrafter.describe`` gives it (None: the
    configuration has none)."""
    from specwise.drafters.cross_vocab import CrossVocabDrafter

    drafters = runner.engine.drafters if isinstance(runner, SpecwiseRunner) else []
    found = [d.describe() for d in drafters if isinstance(d, CrossVocabDrafter)]
    return found[0] if found else None


def _llama_cpp_file(settings: BenchSettings):
    """The GGUF file llama.cpp runs (None without the peer); points ``find_llama_cpp`` at a given folder."""
    if settings.llama_cpp is None:
        return None
    from specwise.lab.bench.llamacpp import ENV_VAR, find_llama_cpp
    from specwise.models.loader import gguf_source

    if settings.llama_cpp:
        os.environ[ENV_VAR] = str(settings.llama_cpp)
    if find_llama_cpp() is None:
        raise FileNotFoundError(
            f"llama.cpp binaries not found (in ${ENV_VAR} or ~/.cache/specwise-peers/llama.cpp/bin): build them "
            "as specwise/lab/bench/llamacpp.py describes, or pass their folder: --llama-cpp PATH"
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
