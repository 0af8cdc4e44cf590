"""Hostile head directories and training checkpoints (untrusted input, DESIGN lesson 15): each is refused with one
line naming the file and what was wrong (HeadFileError / TargetMismatchError / TrainStateError, all ValueErrors),
before any tensor reaches a native kernel; a pickle that would run code is refused without running it."""

from __future__ import annotations

import json
import pickle
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import tiny_llama
from specwise.distill.train import TrainStateError, train_head
from specwise.drafters import make_drafter
from specwise.drafters.head import (
    HeadDrafter,
    HeadFileError,
    HeadNotFoundError,
    TargetMismatchError,
    load_head,
    new_head,
    save_head,
)
from specwise.engine import Engine
from specwise.models.loader import LoadedModel
from specwise.models.native import NativeModel

SHIPPED = Path(__file__).resolve().parent.parent / "specwise" / "shipped" / "heads" / "smollm2-135m-instruct"
VOCAB = 96  # the tiny target's


@pytest.fixture(scope="module")
def hf():
    return tiny_llama(seed=1)


@pytest.fixture(scope="module")
def good(hf, tmp_path_factory) -> Path:
    """A valid float16 head for the tiny target, as `specwise distill` writes it."""
    head = new_head(hf, "tiny", torch.arange(0, VOCAB, 3), seed=0)
    for p in head.parameters():
        p.data.normal_(0, 0.3)
    directory = tmp_path_factory.mktemp("heads") / "good"
    save_head(head, directory)
    return directory


def _copy(good: Path, tmp_path: Path) -> Path:
    directory = tmp_path / "head"
    shutil.copytree(good, directory)
    return directory


def _refused(directory: Path, match: str, error: type = HeadFileError, file: str | None = None) -> Exception:
    """load_head refuses ``directory`` with ``error`` (a ValueError): one line matching ``match``, naming ``file``
    (of the directory) when given."""
    with pytest.raises(error, match=match) as info:
        load_head(directory)
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, ValueError)
    if file is not None:
        assert str(directory / file) in message
    return info.value


# ---- config.json ----------------------------------------------------------------------------------------------


def _set(key: str, value):
    def edit(config: dict) -> None:
        *parents, last = key.split(".")
        for part in parents:
            config = config[part]
        config[last] = value

    return edit


def _drop(key: str):
    return lambda config: config.pop(key)


CONFIG_CASES = {
    "size as a string": (_set("hidden_size", "32"), r"hidden_size is '32', expected an integer"),
    "negative size": (_set("num_heads", -4), r"num_heads is -4, expected an integer in 1\.\."),
    "zero size": (_set("intermediate_size", 0), r"intermediate_size is 0"),
    "size as a float": (_set("head_dim", 8.0), r"head_dim is 8\.0"),
    "size as a bool": (_set("num_kv_heads", True), r"num_kv_heads is True"),
    "huge size": (_set("intermediate_size", 1 << 40), r"intermediate_size is 1099511627776"),
    "heads not in groups": (_set("num_kv_heads", 3), r"not a multiple of num_kv_heads 3"),
    "odd head_dim": (_set("head_dim", 7), r"head_dim is 7, expected an even size"),
    "head_dim over the kernels' limit": (_set("head_dim", 1024), r"head_dim is 1024"),
    "NaN rms_eps": (_set("rms_eps", float("nan")), r"rms_eps is nan, expected a finite number"),
    "negative rms_eps": (_set("rms_eps", -1e-6), r"rms_eps is -1e-06"),
    "another format": (_set("format", "gguf"), r"format is 'gguf', expected 'specwise-head'"),
    "newer format": (_set("format_version", 99), r"format_version is 99.*upgrade specwise"),
    "missing field": (_drop("draft_vocab_size"), r"has no 'draft_vocab_size'"),
    "unknown field": (_set("rope_scaling", {"type": "yarn"}), r"unknown field 'rope_scaling'"),
    "target not an object": (_set("target", "tiny"), r"target is 'tiny', expected an object"),
    "target vocab as string": (_set("target.vocab_size", "96"), r"target.vocab_size is '96'"),
    "target hidden differs from the head's": (_set("target.hidden_size", 64), r"target.hidden_size is 64"),
    "fingerprint not a list": (_set("target.fingerprint", 0.1), r"target.fingerprint is 0.1"),
    "fingerprint with a string": (_set("target.fingerprint", [0.1, "x"]), r"target.fingerprint\[1\] is 'x'"),
    "draft vocab larger than the target's": (_set("draft_vocab_size", VOCAB + 1), r"draft_vocab_size is 97"),
    "training not an object": (_set("training", []), r"training is \[\], expected an object"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_a_hostile_config_field_is_refused(good, tmp_path, case):
    edit, match = CONFIG_CASES[case]
    directory = _copy(good, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    edit(config)
    (directory / "config.json").write_text(json.dumps(config))
    _refused(directory, match, file="config.json")


@pytest.mark.parametrize(
    "text, match",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2, 3]", "holds a JSON list, expected an object"),
        ('"a head"', "holds a JSON str"),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON"),  # nested beyond the parser's recursion
        (b"\xff\xfe{}", "not valid JSON"),
        ("", "not valid JSON"),
    ],
)
def test_a_config_that_is_not_a_json_object_is_refused(good, tmp_path, text, match):
    directory = _copy(good, tmp_path)
    path = directory / "config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    _refused(directory, match, file="config.json")


def test_a_missing_or_oversized_config_is_refused(good, tmp_path):
    directory = _copy(good, tmp_path)
    (directory / "config.json").write_text(" " * (2 << 20))
    _refused(directory, "bytes, expected a config of at most", file="config.json")
    (directory / "config.json").unlink()
    assert isinstance(_refused(directory, "no config.json", HeadNotFoundError), FileNotFoundError)
    (directory / "model.safetensors").unlink()
    shutil.copy(good / "config.json", directory / "config.json")
    _refused(directory, "has no model.safetensors", HeadNotFoundError)


# ---- model.safetensors ----------------------------------------------------------------------------------------


def _rewrite(directory: Path, edit) -> None:
    """Apply ``edit`` to the tensors of the head's file and write it back (a well-formed safetensors file)."""
    tensors = load_file(str(directory / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(directory / "model.safetensors"))


def _put(name: str, value):
    def edit(tensors: dict) -> None:
        tensors[name] = value(tensors[name]) if callable(value) else value

    return edit


def _nan_at(name: str, value: float):
    def poison(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t.view(-1)[t.numel() // 2] = value
        return t

    return _put(name, poison)


TENSOR_CASES = {
    "wrong shape": (_put("qkv.weight", lambda t: t[:-8]), r"tensor 'qkv.weight' has shape \[56, 32\], expected \[64"),
    "transposed": (_put("fc.weight", lambda t: t.T.contiguous()), r"tensor 'fc.weight' has shape \[64, 32\]"),
    "wrong dtype of the ids": (_put("vocab_ids", lambda t: t.int()), r"tensor 'vocab_ids' is I32, expected I64"),
    "integer weights": (_put("o.weight", lambda t: t.to(torch.int16)), r"tensor 'o.weight' is I16, expected F16"),
    "mixed weight dtypes": (_put("down.weight", lambda t: t.float()), r"the weights mix dtypes F16, F32"),
    "rotary table in float16": (_put("inv_freq", lambda t: t.half()), r"tensor 'inv_freq' is F16, expected F32"),
    "missing tensor": (lambda t: t.pop("mlp_norm"), r"no tensor 'mlp_norm'"),
    "extra tensor": (_put("lm_head.weight", torch.zeros(4, 32, dtype=torch.float16)), r"unknown tensor 'lm_head"),
    "ids beyond the target's vocabulary": (
        _put("vocab_ids", lambda t: t + 60),
        r"tensor 'vocab_ids' holds ids 60\.\.153, expected ids in the target's 0\.\.95",
    ),
    "negative ids": (_put("vocab_ids", lambda t: t - 3), r"holds ids -3\.\.90"),
    "repeated ids": (_put("vocab_ids", lambda t: torch.full_like(t, 5)), r"not strictly increasing"),
    "unsorted ids": (_put("vocab_ids", lambda t: t.flip(0)), r"not strictly increasing"),
    "NaN weight": (_nan_at("gate_up.weight", float("nan")), r"tensor 'gate_up.weight' holds NaN or infinite"),
    "infinite weight": (_nan_at("attn_norm", float("-inf")), r"tensor 'attn_norm' holds NaN or infinite"),
    "NaN rotary frequency": (_nan_at("inv_freq", float("nan")), r"tensor 'inv_freq' holds NaN"),
    "zero rotary frequency": (_nan_at("inv_freq", 0.0), r"tensor 'inv_freq' holds values <= 0"),
}


@pytest.mark.parametrize("case", sorted(TENSOR_CASES))
def test_a_hostile_tensor_is_refused(good, tmp_path, case):
    edit, match = TENSOR_CASES[case]
    directory = _copy(good, tmp_path)
    _rewrite(directory, edit)
    _refused(directory, match, file="model.safetensors")


def _header_length_huge(data: bytes) -> bytes:
    return struct.pack("<Q", 1 << 62) + data[8:]


def _offsets_beyond_the_file(data: bytes) -> bytes:
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    header["vocab_ids"]["data_offsets"][1] += 1 << 30
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data[8 + n :]


def _header_not_json(data: bytes) -> bytes:
    n = struct.unpack("<Q", data[:8])[0]
    return data[:8] + b"{" * n + data[8 + n :]


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # truncated
        lambda data: data[:5],  # shorter than the header's length
        lambda data: b"",
        _header_length_huge,
        _offsets_beyond_the_file,
        _header_not_json,
        lambda data: b"PK\x03\x04" + data[4:],  # another format
    ],
    ids=["truncated", "5 bytes", "empty", "header length huge", "offsets beyond the file", "header not JSON", "zip"],
)
def test_a_damaged_safetensors_file_is_refused(good, tmp_path, damage):
    directory = _copy(good, tmp_path)
    path = directory / "model.safetensors"
    path.write_bytes(damage(path.read_bytes()))
    _refused(directory, "not a valid safetensors file", file="model.safetensors")


# ---- the head against its target ------------------------------------------------------------------------------


def _loaded(hf, name: str = "tiny") -> LoadedModel:
    return LoadedModel(NativeModel(hf, name=name), None, name, hf)


def test_a_head_for_a_wider_target_is_refused_by_the_target_checks(tmp_path, hf):
    """A self-consistent head of hidden size 64 (its file and config agree) is refused for the 32-wide target:
    by check_target through make_drafter, and by attach_target when a caller skips check_target."""
    wide = tiny_llama(seed=1, hidden=64)
    save_head(new_head(wide, "tiny", torch.arange(0, VOCAB, 2)), tmp_path / "wide")
    head = load_head(tmp_path / "wide")
    with pytest.raises(TargetMismatchError, match="hidden_size") as info:
        make_drafter(f"head:{tmp_path / 'wide'}", _loaded(hf))
    assert isinstance(info.value, HeadFileError) and "\n" not in str(info.value)
    with pytest.raises(TargetMismatchError, match=r"hidden_size is 64, but the target's embedding is \[96, 32\]"):
        head.attach_target(hf)


def test_a_head_with_ids_beyond_a_smaller_target_is_refused_on_attach(good, hf):
    """The file's ids fit its recorded vocabulary (96) but not a smaller target's (48 tokens)."""
    small = tiny_llama(seed=1, vocab=48)
    head = load_head(good)
    with pytest.raises(TargetMismatchError, match="draft vocabulary holds token 93, outside the target's 48"):
        head.attach_target(small)
    with pytest.raises(TargetMismatchError, match="vocab_size"):
        make_drafter(f"head:{good}", _loaded(small, "small"))


def test_hostile_heads_are_refused_through_make_drafter(good, tmp_path, hf):
    """The path `--drafter head:DIR` takes: the same refusals, before a drafter (or a native kernel) exists."""
    directory = _copy(good, tmp_path)
    _rewrite(directory, TENSOR_CASES["NaN weight"][0])
    with pytest.raises(HeadFileError, match="gate_up.weight"):
        make_drafter(f"head:{directory}", _loaded(hf))
    (directory / "config.json").write_text("[]")
    with pytest.raises(HeadFileError, match="holds a JSON list"):
        make_drafter(f"head:{directory}", _loaded(hf))


def test_the_native_step_checks_its_buffers(good, hf):
    """Features of another width never reach a native step: the drafter and the quantized layer refuse them."""
    target = NativeModel(hf)
    head = load_head(good)
    head.attach_target(hf)
    drafter = HeadDrafter(head, target, quantized=True)
    with pytest.raises(ValueError, match=r"the head reads features \[n, 32\], got \[2, 64\]"):
        drafter._step(torch.zeros(2, 64), torch.tensor([1, 2]), 0)
    if drafter.quantized:
        layer = drafter._q[1]
        emb = torch.zeros(2, 32)
        with pytest.raises(ValueError, match="native step got"):
            caches, tables = (drafter.k_cache, drafter.v_cache), (drafter._cos, drafter._sin)
            layer.step(emb, emb, drafter._capacity, *caches, *tables, drafter._ends)


# ---- valid heads ------------------------------------------------------------------------------------------------


def test_the_good_head_loads_and_drafts_exactly(good, hf):
    target = _loaded(hf)
    drafter = make_drafter(f"head:{good}", target)
    ref = Engine(NativeModel(hf), None, gamma=0).generate([3, 4], max_new_tokens=12, eos_token_ids=[]).token_ids
    out = Engine(target.model, drafter, gamma=3).generate([3, 4], max_new_tokens=12, eos_token_ids=[]).token_ids
    assert out == ref


def test_the_shipped_head_loads_unchanged():
    """The shipped head passes every check, and what loads is the file's tensors as they are (dtype=None)."""
    head = load_head(SHIPPED, dtype=None)
    raw = load_file(str(SHIPPED / "model.safetensors"))
    state = head.state_dict()
    assert set(state) == set(raw)
    for name, value in raw.items():
        assert state[name].dtype == value.dtype and torch.equal(state[name], value), name
    assert head.config.draft_vocab_size == 8192 and head.config.target["vocab_size"] == 49152


# ---- training checkpoints ---------------------------------------------------------------------------------------


class _Planted:
    """Unpickling this object opens (creates) ``marker``: what a planted checkpoint could do, and worse."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _train_setup():
    from test_distill import _setup

    hf, head, batches, cfg = _setup()
    return head, batches, cfg, hf.get_output_embeddings().weight.detach()


@pytest.fixture(scope="module")
def training():
    """A head, its batches, config and the target's output layer (refusals leave the head as it was)."""
    return _train_setup()


def _resume(path: Path, setup=None):
    head, batches, cfg, full = setup or _train_setup()
    return train_head(head, batches, batches[:1], full, cfg, path, resume=True, progress=False, log=lambda m: None)


def test_a_planted_pickle_in_the_checkpoint_is_refused_without_running(tmp_path, training):
    marker = tmp_path / "marker"
    path = tmp_path / "train_state.pt"
    pickle.loads(pickle.dumps(_Planted(marker)))  # the control: unpickling it runs the plant
    assert marker.exists()
    marker.unlink()
    torch.save({"head": _Planted(marker), "step": 1}, path)
    with pytest.raises(TrainStateError, match="Python objects other than tensors.*without --resume") as info:
        _resume(path, training)
    assert not marker.exists()
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def _state(tmp_path: Path) -> tuple[Path, dict]:
    """A real checkpoint after one step, and its contents."""
    head, batches, cfg, full = _train_setup()
    path = tmp_path / "train_state.pt"
    train_head(head, batches, batches[:1], full, cfg, path, progress=False, log=lambda m: None, max_steps=1)
    return path, torch.load(path, weights_only=True)


def test_a_malformed_checkpoint_is_refused(tmp_path, training):
    import copy

    path, state = _state(tmp_path)
    raw = path.read_bytes()
    key = "qkv.weight"
    files = {  # damage to the file
        "not a readable training state": lambda: path.write_bytes(raw[:100]),
        "not a training state": lambda: torch.save([1, 2], path),
    }
    edits = {  # damage to the state
        "head does not hold the tensors": lambda s: s["head"].pop(key),
        "is not a tensor of shape": lambda s: s["head"].__setitem__(key, s["head"][key][:1]),
        "holds NaN": lambda s: s["head"].__setitem__(key, s["head"][key] * float("nan")),
        "'vocab_ids'.* differs": lambda s: s["head"].__setitem__("vocab_ids", s["head"]["vocab_ids"].flip(0)),
        "one parameter group": lambda s: s["optimizer"].__setitem__("param_groups", []),
        "optimizer state 2": lambda s: s["optimizer"]["state"][2].__setitem__("exp_avg", torch.zeros(3)),
        "step is -1": lambda s: s.__setitem__("step", -1),
        "history is not": lambda s: s.__setitem__("history", [torch.zeros(2)]),
        "torch_rng is not": lambda s: s.__setitem__("torch_rng", torch.zeros(3, dtype=torch.uint8)),
    }
    for match, damage in [*files.items(), *edits.items()]:
        if match in files:
            damage()
        else:
            damaged = copy.deepcopy(state)
            damage(damaged)
            torch.save(damaged, path)
        with pytest.raises(TrainStateError, match=match) as info:
            _resume(path, training)
        assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_valid_checkpoint_resumes(tmp_path):
    path, state = _state(tmp_path)
    report = _resume(path)
    assert report["steps"] > state["step"] == 1
