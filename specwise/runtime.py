"""Putting the pieces together: device choice, prompt encoding, and an Engine built from CLI-style specs.

Shared by the CLI, the server and the benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass

from specwise.engine import Engine
from specwise.planner import make_planner

__all__ = ["Runtime", "build_runtime", "encode_chat", "encode_prompt", "resolve_device", "saved_cost_prior"]


def _torch_if_installed():
    """torch when the hf (or cuda) extra is installed, else None; imported only here, on request."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch


def _nvidia_driver() -> bool:
    """Whether this machine has an NVIDIA driver loaded (Linux: /proc/driver/nvidia): without one CUDA cannot be
    available, and ``auto`` need not import torch to find that out."""
    import os

    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidia0")


def resolve_device(name: str) -> str:
    """`auto` picks CUDA when torch is installed and sees a GPU, else the CPU; `cpu`, and `auto` on a machine without
    an NVIDIA driver, never import torch.

    `cuda` (or `cuda:N`) without torch raises MissingExtraError naming the cuda extra."""
    if name == "cpu":
        return name
    if name != "auto" and not name.startswith(("cuda", "mps", "xpu")):
        raise ValueError(f"unknown device {name!r}: use auto, cpu, cuda or cuda:N")
    if name == "auto" and not _nvidia_driver():
        return "cpu"
    torch = _torch_if_installed()
    if name == "auto":
        return "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
    if torch is None:
        from specwise.extras import require

        require("cuda" if name.startswith("cuda") else "hf", f"device {name!r}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: CUDA is not available on this machine; use cpu")
    return name


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a conversation through the tokenizer's chat template, ready for the assistant's reply."""
    if tokenizer is None:
        raise ValueError("this model has no tokenizer: specwise needs one to encode the prompt")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template: use raw completion (--no-chat)")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list[int]:
    """Token ids of a prompt: as a user message through the chat template when there is one and ``chat`` is set,
    else as raw text."""
    if tokenizer is None:
        raise ValueError("this model has no tokenizer: specwise needs one to encode the prompt")
    if chat and getattr(tokenizer, "chat_template", None):
        return encode_chat(tokenizer, [{"role": "user", "content": prompt}])
    return list(tokenizer(prompt)["input_ids"])


@dataclass
class Runtime:
    """A loaded target, its tokenizer, and an engine with the chosen drafter."""

    engine: Engine
    target: object  # LoadedModel
    drafter_spec: str
    device: str

    @property
    def tokenizer(self):
        return self.target.tokenizer


def build_runtime(
    target: str = "default",
    drafter: str = "auto",
    gamma: int | str = 4,
    device: str = "auto",
    impl: str = "auto",
    precision: str | None = None,
    attention: str = "float32",
    kv_cache: str = "float32",
) -> Runtime:
    """Load ``target``, build ``drafter`` (checked against the target's vocabulary) and an Engine.

    drafter: a spec as in ``make_drafter``; ``auto`` resolves to the shipped head or ngram (``Runtime.drafter_spec``
    holds what was chosen).
    impl: ``auto`` (the native model for the Llama family, else the Hugging Face adapter), ``native`` or ``hf``.
    precision: ``q8`` or ``exact`` for GGUF models on the quantized native path (None: the default, q8).
    attention, kv_cache: the target's attention and KV cache formats on that path (``load_model``).
    """
    from specwise.models.loader import DEFAULT_PRECISION
    from specwise.models.threads import run_apart

    planner = make_planner(gamma)  # gamma decided (and checked) once, before anything is loaded
    device = resolve_device(device)
    precision = precision or DEFAULT_PRECISION
    # in a thread that ends with the loading: the kernels' start-up work leaves no OpenMP threads on this thread,
    # which may live on beside the one that decodes (a server's event loop; see run_apart)
    formats = {"attention": attention, "kv_cache": kv_cache}
    loaded, drafter, draft = run_apart(_load, target, drafter, device, impl, precision, formats)
    engine = Engine(
        loaded.model,
        draft,
        gamma=planner.with_cost_curve(saved_cost_prior(loaded, device)),
        tokenizer=loaded.tokenizer,
        eos_token_ids=eos_ids(loaded),
    )
    return Runtime(engine, loaded, drafter, device)


def _load(target: str, drafter: str, device: str, impl: str, precision: str, formats: dict):
    """The target loaded, the drafter spec resolved and the drafter built (``build_runtime``)."""
    from specwise.drafters import build_drafter, resolve_drafter_spec
    from specwise.models import load_model
    from specwise.models.loader import release_free_memory

    loaded = load_model(target, device=device, dtype=None, impl=impl, precision=precision, **formats)  # dtype float32
    drafter = resolve_drafter_spec(drafter, loaded)
    draft = build_drafter(drafter, loaded, device=device, impl=impl, precision=precision)
    release_free_memory()  # what building the drafter left free (its weights' conversions)
    return loaded, drafter, draft


def saved_cost_prior(loaded, device: str) -> dict[int, float] | None:
    """The adaptive planner's prior for the cost of target passes: the cost curve c(k) that `specwise profile`
    measured for this target (a LoadedModel) on ``device`` with the same implementation, if it ran."""
    from specwise.artifacts import saved_cost_curve
    from specwise.models.loader import profile_device

    model = loaded.model
    return saved_cost_curve(loaded.name, profile_device(device, model), type(model).__name__)


def eos_ids(loaded) -> set[int] | None:
    """End-of-sequence tokens of a loaded model (``specwise.models.loader.eos_ids``)."""
    from specwise.models.loader import eos_ids as model_eos_ids

    return model_eos_ids(loaded)
