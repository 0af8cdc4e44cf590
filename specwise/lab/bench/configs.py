"""What ``specwise bench`` runs: the methods and their ids, one configuration (:class:`BenchConfig`), the settings
of a run (:class:`BenchSettings`) and the list of configurations they span (:func:`make_configs`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from specwise.sampling import SamplingParams

__all__ = [
    "SPECWISE",
    "HF_GENERATE",
    "HF_ASSISTED",
    "LLAMA_CPP",
    "PLAIN_ID",
    "HF_GENERATE_ID",
    "LLAMA_CPP_ID",
    "BenchConfig",
    "BenchSettings",
    "make_configs",
]

SPECWISE = "specwise"
HF_GENERATE = "hf_generate"
HF_ASSISTED = "hf_assisted"
LLAMA_CPP = "llama_cpp"
PLAIN_ID = "specwise:none"
HF_GENERATE_ID = "hf_generate"
LLAMA_CPP_ID = "llama_cpp"
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
        model_id, sep, query = arg.partition("?")  # options: model:ID?vocab=N&ranking=FILE
        options = (o.partition("=") for o in query.split("&")) if sep else ()
        query = "&".join(f"{k}={os.path.basename(v) if k == 'ranking' else v}" for k, _, v in options)
        return f"model:{os.path.basename(model_id.rstrip('/')) or model_id}{sep}{query}"
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
