"""Hostile head directories and training checkpoints (untrusted input, DESIGN lesson 15): each is refused with one
line naming the file and what was wrong (HeadFileError / TargetMismatchError / TrainStateError, all ValueErrors),
before any tensor reaches a native kernel; a pickle that would run code is refused without running it.

The head files are read without torch (the heads here are numpy, their target a tiny GGUF file); the training
checkpoints are torch's (the hf extra)."""

from __future__ import annotations

import json
import pickle
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf_raw import ARRAY, HIDDEN, STRING, q8_0, tiny_model

from conftest import needs_hf
from specwise.drafters import make_drafter
from specwise.drafters.head import (
    HeadConfig,
    HeadDrafter,
    HeadFileError,
    HeadNotFoundError,
    HeadWeights,
    TargetMismatchError,
    load_head,
    read_head,
)
from specwise.drafters.head.checks import read_safetensors, write_safetensors
from specwise.drafters.head.format import head_tensor_shapes, target_identity, write_head
from specwise.engine import Engine
from specwise.models.loader import LoadedModel
from specwise.models.quantized import QuantizedModel, TargetWeights

SHIPPED = Path(__file__).resolve().parent.parent / "specwise" / "shipped" / "heads" / "smollm2-135m-instruct"
VOCAB = 96  # the tiny target's


def _gguf(path: Path, vocab: int = VOCAB, seed: int = 0) -> QuantizedModel:
    """The tiny GGUF target (hidden 64, 4 heads of 16, 2 key-value heads) with ``vocab`` tokens, at ``path``."""
    g = tiny_model(seed=seed)
    if vocab != VOCAB:
        embed = g.tensor("token_embd.weight")
        embed.dims, embed.data = [HIDDEN, vocab], q8_0(vocab, HIDDEN, np.random.default_rng(seed))
        g.set("tokenizer.ggml.tokens", ARRAY, (STRING, [f"t{i}" for i in range(vocab)]))
    path.write_bytes(g.bytes())
    return QuantizedModel(path, name="tiny")


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> QuantizedModel:
    return _gguf(tmp_path_factory.mktemp("target") / "tiny.gguf")


def _numpy_head(target: QuantizedModel, vocab_ids, hidden: int = HIDDEN, seed: int = 0) -> HeadWeights:
    """A random head (float16 weights, as shipped) recording ``target``'s identity; ``hidden`` other than the
    target's makes a self-consistent head for a wider or narrower target."""
    identity = {**target_identity(TargetWeights(target), "tiny"), "hidden_size": hidden}
    config = HeadConfig(hidden, 4, 2, hidden // 4, 2 * hidden, 1e-5, len(vocab_ids), identity)
    rng = np.random.default_rng(seed)
    tensors = {name: rng.normal(0, 0.3, shape).astype(np.float16) for name, shape in head_tensor_shapes(config).items()}
    tensors["vocab_ids"] = np.asarray(vocab_ids, dtype=np.int64)
    tensors["inv_freq"] = (1.0 / 10000.0 ** (np.arange(0, hidden // 4, 2) / (hidden // 4))).astype(np.float32)
    return HeadWeights(config, tensors)


def _save(head: HeadWeights, directory: Path) -> Path:
    write_head(directory, head.config, head.tensors)
    return directory


@pytest.fixture(scope="module")
def good(target, tmp_path_factory) -> Path:
    """A valid float16 head for the tiny target, as `specwise distill` writes it."""
    return _save(_numpy_head(target, np.arange(0, VOCAB, 3)), tmp_path_factory.mktemp("heads") / "good")


def _copy(good: Path, tmp_path: Path) -> Path:
    directory = tmp_path / "head"
    shutil.copytree(good, directory)
    return directory


def _refused(directory: Path, match: str, error: type = HeadFileError, file: str | None = None) -> Exception:
    """read_head refuses ``directory`` with ``error`` (a ValueError): one line matching ``match``, naming ``file``
    (of the directory) when given."""
    with pytest.raises(error, match=match) as info:
        read_head(directory)
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
    "size as a string": (_set("hidden_size", "64"), r"hidden_size is '64', expected an integer"),
    "negative size": (_set("num_heads", -4), r"num_heads is -4, expected an integer in 1\.\."),
    "zero size": (_set("intermediate_size", 0), r"intermediate_size is 0"),
    "size as a float": (_set("head_dim", 16.0), r"head_dim is 16\.0"),
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
    "target hidden differs from the head's": (_set("target.hidden_size", 32), r"target.hidden_size is 32"),
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


def _load(path: Path) -> dict[str, np.ndarray]:
    found, read = read_safetensors(path, 1 << 30)
    return {name: read(name) for name in found}


def _rewrite(directory: Path, edit) -> None:
    """Apply ``edit`` to the tensors of the head's file and write it back (a well-formed safetensors file)."""
    tensors = _load(directory / "model.safetensors")
    edit(tensors)
    write_safetensors(directory / "model.safetensors", tensors)


def _put(name: str, value):
    def edit(tensors: dict) -> None:
        tensors[name] = value(tensors[name]) if callable(value) else value

    return edit


def _nan_at(name: str, value: float):
    def poison(t: np.ndarray) -> np.ndarray:
        t = t.copy()
        t.reshape(-1)[t.size // 2] = value
        return t

    return _put(name, poison)


TENSOR_CASES = {
    "wrong shape": (_put("qkv.weight", lambda t: t[:-8]), r"tensor 'qkv.weight' has shape \[120, 64\], expected \[128"),
    "transposed": (_put("fc.weight", lambda t: t.T.copy()), r"tensor 'fc.weight' has shape \[128, 64\]"),
    "wrong dtype of the ids": (_put("vocab_ids", lambda t: t.astype(np.int32)), r"'vocab_ids' is I32, expected I64"),
    "integer weights": (_put("o.weight", lambda t: t.astype(np.int16)), r"tensor 'o.weight' is I16, expected F16"),
    "mixed weight dtypes": (_put("down.weight", lambda t: t.astype(np.float32)), r"the weights mix dtypes F16, F32"),
    "rotary table in float16": (_put("inv_freq", lambda t: t.astype(np.float16)), r"'inv_freq' is F16, expected F32"),
    "missing tensor": (lambda t: t.pop("mlp_norm"), r"no tensor 'mlp_norm'"),
    "extra tensor": (_put("lm_head.weight", np.zeros((4, 64), dtype=np.float16)), r"unknown tensor 'lm_head"),
    "ids beyond the target's vocabulary": (
        _put("vocab_ids", lambda t: t + 60),
        r"tensor 'vocab_ids' holds ids 60\.\.153, expected ids in the target's 0\.\.95",
    ),
    "negative ids": (_put("vocab_ids", lambda t: t - 3), r"holds ids -3\.\.90"),
    "repeated ids": (_put("vocab_ids", lambda t: np.full_like(t, 5)), r"not strictly increasing"),
    "unsorted ids": (_put("vocab_ids", lambda t: t[::-1].copy()), r"not strictly increasing"),
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


def _header(data: bytes) -> tuple[dict, int]:
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8 : 8 + n]), n


def _with_header(data: bytes, edit) -> bytes:
    header, n = _header(data)
    edit(header)
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data[8 + n :]


def _offsets_beyond_the_file(data: bytes) -> bytes:
    def edit(h: dict) -> None:
        h["vocab_ids"]["data_offsets"][1] += 1 << 30

    return _with_header(data, edit)


def _overlapping(data: bytes) -> bytes:
    """Two tensors of one size whose offsets name the same bytes (each entry consistent on its own)."""

    def edit(h: dict) -> None:
        h["attn_norm"]["data_offsets"] = list(h["mlp_norm"]["data_offsets"])

    return _with_header(data, edit)


def _header_not_json(data: bytes) -> bytes:
    n = struct.unpack("<Q", data[:8])[0]
    return data[:8] + b"{" * n + data[8 + n :]


DAMAGES = {
    "truncated": lambda data: data[: len(data) // 2],
    "5 bytes": lambda data: data[:5],
    "empty": lambda data: b"",
    "header length huge": _header_length_huge,
    "offsets beyond the file": _offsets_beyond_the_file,
    "overlapping tensors": _overlapping,
    "header not JSON": _header_not_json,
    "zip": lambda data: b"PK\x03\x04" + data[4:],  # another format
    "trailing bytes": lambda data: data + b"\0" * 8,
    "header a list": lambda data: struct.pack("<Q", 2) + b"[]" + data[8 + _header(data)[1] :],
    "unknown dtype": lambda data: _with_header(data, lambda h: h["inv_freq"].__setitem__("dtype", "F128")),
    "negative dimension": lambda data: _with_header(data, lambda h: h["inv_freq"].__setitem__("shape", [-8])),
    "shape not the offsets' size": lambda data: _with_header(data, lambda h: h["inv_freq"].__setitem__("shape", [7])),
    "extra entry field": lambda data: _with_header(data, lambda h: h["inv_freq"].__setitem__("offset", 0)),
    "metadata not strings": lambda data: _with_header(data, lambda h: h.__setitem__("__metadata__", {"a": 1})),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_safetensors_file_is_refused(good, tmp_path, damage):
    directory = _copy(good, tmp_path)
    path = directory / "model.safetensors"
    path.write_bytes(DAMAGES[damage](path.read_bytes()))
    _refused(directory, "not a valid safetensors file", file="model.safetensors")


def test_a_file_of_the_safetensors_package_reads_the_same(tmp_path):
    """The reader and writer here against the safetensors package's own (where it is installed): the shipped
    head's tensors, and a file written here read back by the package."""
    st = pytest.importorskip("safetensors.numpy")
    found, read = read_safetensors(SHIPPED / "model.safetensors", 1 << 30)
    theirs = st.load_file(str(SHIPPED / "model.safetensors"))
    assert set(found) == set(theirs)
    for name, value in theirs.items():
        mine = read(name)
        assert mine.dtype == value.dtype and mine.shape == value.shape, name
        np.testing.assert_array_equal(mine, value, err_msg=name)
    path = tmp_path / "roundtrip.safetensors"
    write_safetensors(path, theirs)
    back = st.load_file(str(path))
    assert set(back) == set(theirs)
    for name, value in theirs.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)


# ---- the head against its target ------------------------------------------------------------------------------


def _loaded(model: QuantizedModel, name: str = "tiny") -> LoadedModel:
    return LoadedModel(model, None, name, TargetWeights(model))


def test_a_head_for_a_wider_target_is_refused_by_the_target_checks(tmp_path, target):
    """A self-consistent head of hidden size 32 (its file and config agree) is refused for the 64-wide target:
    by check_target through make_drafter, and by attach_target when a caller skips check_target."""
    _save(_numpy_head(target, np.arange(0, VOCAB, 2), hidden=32), tmp_path / "narrow")
    head = read_head(tmp_path / "narrow")
    with pytest.raises(TargetMismatchError, match="hidden_size") as info:
        make_drafter(f"head:{tmp_path / 'narrow'}", _loaded(target))
    assert isinstance(info.value, HeadFileError) and "\n" not in str(info.value)
    with pytest.raises(TargetMismatchError, match=r"hidden_size is 32, but the target's embedding is \[96, 64\]"):
        head.attach_target(TargetWeights(target))


def test_a_head_with_ids_beyond_a_smaller_target_is_refused_on_attach(good, tmp_path):
    """The file's ids fit its recorded vocabulary (96) but not a smaller target's (48 tokens)."""
    small = _gguf(tmp_path / "small.gguf", vocab=48)
    head = read_head(good)
    with pytest.raises(TargetMismatchError, match="draft vocabulary holds token 93, outside the target's 48"):
        head.attach_target(TargetWeights(small))
    with pytest.raises(TargetMismatchError, match="vocab_size"):
        make_drafter(f"head:{good}", _loaded(small, "small"))


def test_hostile_heads_are_refused_through_make_drafter(good, tmp_path, target):
    """The path `--drafter head:DIR` takes: the same refusals, before a drafter (or a native kernel) exists."""
    directory = _copy(good, tmp_path)
    _rewrite(directory, TENSOR_CASES["NaN weight"][0])
    with pytest.raises(HeadFileError, match="gate_up.weight"):
        make_drafter(f"head:{directory}", _loaded(target))
    (directory / "config.json").write_text("[]")
    with pytest.raises(HeadFileError, match="holds a JSON list"):
        make_drafter(f"head:{directory}", _loaded(target))


@pytest.mark.parametrize("quantized", [False, True])
def test_the_native_step_checks_its_buffers(good, target, quantized):
    """Features of another width never reach a native step: the drafter and the quantized layer refuse them."""
    head = read_head(good)
    head.attach_target(TargetWeights(target))
    drafter = HeadDrafter(head, target, quantized=quantized)
    with pytest.raises(ValueError, match=r"the head reads features \[n, 64\], got \[2, 128\]"):
        drafter._step(np.zeros((2, 128), dtype=np.float32), [1, 2], 0)
    with pytest.raises(ValueError, match="one next token per feature"):
        drafter._step(np.zeros((2, 64), dtype=np.float32), [1], 0)
    if drafter.quantized:
        layer = drafter._q[1]
        emb = np.zeros((2, 64), dtype=np.float32)
        caches, tables = (drafter.k_cache, drafter.v_cache), (drafter._cos, drafter._sin)
        with pytest.raises(ValueError, match="native step got"):
            layer.step(emb, emb, drafter._capacity, *caches, *tables, drafter._ends)
        with pytest.raises(ValueError, match="native step got"):  # a cache of another dtype
            layer.step(emb, emb, 0, caches[0].astype(np.float64), caches[1], *tables, drafter._ends)
        with pytest.raises(ValueError, match="takes numpy arrays"):
            layer.step(emb.tolist(), emb, 0, *caches, *tables, drafter._ends)


# ---- valid heads ------------------------------------------------------------------------------------------------


def test_the_good_head_loads_and_drafts_exactly(good, target, tmp_path):
    drafter = make_drafter(f"head:{good}", _loaded(target))
    ref = Engine(_gguf(tmp_path / "ref.gguf"), None, gamma=0).generate([3, 4], max_new_tokens=12, eos_token_ids=[])
    out = Engine(target, drafter, gamma=3).generate([3, 4], max_new_tokens=12, eos_token_ids=[]).token_ids
    assert out == ref.token_ids


def test_the_shipped_head_reads_unchanged():
    """The shipped head passes every check, and what reads is the file's tensors as they are (float16 weights)."""
    head = read_head(SHIPPED)
    found, read = read_safetensors(SHIPPED / "model.safetensors", 1 << 30)
    assert set(head.tensors) == set(found) == set(head_tensor_shapes(head.config))
    for name, value in head.tensors.items():
        np.testing.assert_array_equal(value, read(name), err_msg=name)
    assert head.tensors["qkv.weight"].dtype == np.float16 and head.vocab_ids.dtype == np.int64
    assert head.config.draft_vocab_size == 8192 and head.config.target["vocab_size"] == 49152


def test_the_shipped_head_loads_as_the_training_module():
    """load_head (torch) keeps the file's tensors as they are with dtype=None."""
    torch = needs_hf()
    head = load_head(SHIPPED, dtype=None)
    raw = read_head(SHIPPED).tensors
    state = head.state_dict()
    assert set(state) == set(raw)
    for name, value in raw.items():
        assert state[name].dtype == torch.from_numpy(value).dtype and np.array_equal(state[name].numpy(), value), name


# ---- training checkpoints ---------------------------------------------------------------------------------------


class _Planted:
    """Unpickling this object opens (creates) ``marker``: what a planted checkpoint could do, and worse."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _train_setup():
    needs_hf()
    from test_distill import _setup

    hf, head, batches, cfg = _setup()
    return head, batches, cfg, hf.get_output_embeddings().weight.detach()


@pytest.fixture(scope="module")
def training():
    """A head, its batches, config and the target's output layer (refusals leave the head as it was)."""
    return _train_setup()


def _resume(path: Path, setup=None):
    from specwise.lab.distill.train import train_head

    head, batches, cfg, full = setup or _train_setup()
    return train_head(head, batches, batches[:1], full, cfg, path, resume=True, progress=False, log=lambda m: None)


def test_a_planted_pickle_in_the_checkpoint_is_refused_without_running(tmp_path, training):
    torch = needs_hf()
    from specwise.lab.distill.train import TrainStateError

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
    torch = needs_hf()
    from specwise.lab.distill.train import train_head

    head, batches, cfg, full = _train_setup()
    path = tmp_path / "train_state.pt"
    train_head(head, batches, batches[:1], full, cfg, path, progress=False, log=lambda m: None, max_steps=1)
    return path, torch.load(path, weights_only=True)


def test_a_malformed_checkpoint_is_refused(tmp_path, training):
    import copy

    torch = needs_hf()
    from specwise.lab.distill.train import TrainStateError

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
