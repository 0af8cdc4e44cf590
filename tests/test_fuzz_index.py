"""A suffix index directory is untrusted input: hostile variants of each file are refused with one IndexFileError
line naming the file and the problem, before native code searches them; the native entry points refuse arguments
out of bounds themselves; a valid index (the shipped one, a built one) loads and drafts as before."""

from __future__ import annotations

import ctypes
import hashlib
import json
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from specwise.artifacts import shipped_index_dir
from specwise.drafters.suffix import (
    SEP,
    IndexFileError,
    IndexNotFoundError,
    SuffixIndex,
    load_index,
    make_suffix_drafter,
)
from specwise.drafters.suffix.index import SfxDraft, SfxIndex, SfxOut

VOCAB = 100
UNPICKLED: list[str] = []  # what a pickled object's reconstruction would record, were it ever run


def _record(what: str) -> str:
    UNPICKLED.append(what)
    return what


class Payload:
    """An object whose unpickling calls :func:`_record` (proof that a load never unpickles)."""

    def __reduce__(self):
        return _record, ("unpickled",)


def native_lib():
    from specwise.drafters.suffix import _native

    return _native()


@pytest.fixture
def index_dir(tmp_path) -> Path:
    """A valid index of random sequences with repeated phrases, uint16 token ids, small enough that a load checks
    the order of every adjacent pair of its suffix array."""
    from specwise.drafters.suffix import SPOT_PAIRS

    rng = random.Random(0)
    phrases = [[rng.randrange(VOCAB) for _ in range(5)] for _ in range(8)]
    seqs = [sum((rng.choice(phrases) for _ in range(rng.randrange(1, 4))), []) for _ in range(15)]
    SuffixIndex.from_sequences(seqs, info={"target": {"name": "toy", "vocab_size": VOCAB}}).save(tmp_path / "idx")
    assert sum(map(len, seqs)) <= SPOT_PAIRS + 1
    return tmp_path / "idx"


def arrays(directory: Path) -> tuple[np.ndarray, np.ndarray]:
    return np.load(directory / "tokens.npy"), np.load(directory / "sa.npy")


def edit_json(directory: Path, **fields) -> None:
    path = directory / "index.json"
    meta = json.loads(path.read_text())
    meta.update(fields)
    path.write_text(json.dumps(meta))


# ---- hostile variants: (what is changed, file named, what the message says) ---------------------------------------


def sa_of_2_30(d):
    np.save(d / "sa.npy", np.full(len(arrays(d)[1]), 1 << 30, dtype=np.int32))


def sa_negative(d):
    sa = arrays(d)[1]
    sa[3] = -5
    np.save(d / "sa.npy", sa)


def sa_longer(d):
    sa = arrays(d)[1]
    np.save(d / "sa.npy", np.concatenate([sa, sa[:4]]))


def tokens_shorter(d):  # the last sequence cut off: sa expects more tokens than there are
    tokens = arrays(d)[0]
    np.save(d / "tokens.npy", tokens[: np.flatnonzero(tokens == 0xFFFF)[-2] + 1])


def tokens_cut_mid_sequence(d):
    np.save(d / "tokens.npy", arrays(d)[0][:-3])


def tokens_float(d):
    np.save(d / "tokens.npy", arrays(d)[0].astype(np.float32))


def sa_int8(d):
    np.save(d / "sa.npy", arrays(d)[1].astype(np.int8))


def sa_int64(d):
    np.save(d / "sa.npy", arrays(d)[1].astype(np.int64))


def sa_big_endian(d):
    np.save(d / "sa.npy", arrays(d)[1].astype(">i4"))


def tokens_pickled(d):
    np.save(d / "tokens.npy", np.array([Payload(), 1, 2], dtype=object), allow_pickle=True)


def sa_rank_2(d):
    sa = arrays(d)[1]
    np.save(d / "sa.npy", sa[: len(sa) // 2 * 2].reshape(-1, 2))


def tokens_fortran_order(d):
    tokens = arrays(d)[0]
    np.save(d / "tokens.npy", np.asfortranarray(np.stack([tokens, tokens], axis=1)))


def sa_reversed(d):
    np.save(d / "sa.npy", arrays(d)[1][::-1].copy())


def sa_swapped(d):
    sa = arrays(d)[1]
    sa[[10, 20]] = sa[[20, 10]]
    np.save(d / "sa.npy", sa)


def sa_duplicate(d):  # not a permutation: one position twice, another never
    sa = arrays(d)[1]
    sa[5] = sa[6]
    np.save(d / "sa.npy", sa)


def sa_points_at_separator(d):
    tokens, sa = arrays(d)
    sa[-1] = np.flatnonzero(tokens == 0xFFFF)[-1]  # the largest suffix, moved to the text's last separator
    np.save(d / "sa.npy", sa)


def token_over_vocab(d):
    tokens = arrays(d)[0]
    tokens[2] = VOCAB + 7
    np.save(d / "tokens.npy", tokens)


def truncated_npy(d):
    data = (d / "sa.npy").read_bytes()
    (d / "sa.npy").write_bytes(data[:-10])


def trailing_bytes(d):
    with open(d / "tokens.npy", "ab") as f:
        f.write(b"\0" * 6)


def header_claims_huge_shape(d):  # a header that would allocate terabytes if believed
    data = (d / "sa.npy").read_bytes()
    shape = f"({len(arrays(d)[1])},)".encode()
    (d / "sa.npy").write_bytes(data.replace(shape, b"(999999999999,)".ljust(len(shape)), 1))


def header_garbage(d):
    data = bytearray((d / "sa.npy").read_bytes())
    data[10:40] = b"__import__('os').system('x')  "
    (d / "sa.npy").write_bytes(bytes(data))


def not_npy(d):
    (d / "tokens.npy").write_bytes(b"PK\x03\x04 not an array at all")


def empty_tokens(d):
    (d / "tokens.npy").write_bytes(b"")


def empty_sa(d):
    (d / "sa.npy").write_bytes(b"")


def json_corrupt(d):
    (d / "index.json").write_text('{"format": "specwise-suffix-index", "format_version": 1,')


def json_not_utf8(d):
    (d / "index.json").write_bytes(b'{"format": "\xff\xfe"}')


def json_list(d):
    (d / "index.json").write_text("[1, 2, 3]")


def json_deep(d):
    (d / "index.json").write_text("[" * 100_000 + "]" * 100_000)


def json_huge(d):
    (d / "index.json").write_text('{"pad": "' + "x" * (2 << 20) + '"}')


def json_other_format(d):
    edit_json(d, format="gguf")


def json_newer_version(d):
    edit_json(d, format_version=99)


def json_version_string(d):
    edit_json(d, format_version="1")


def json_depth_string(d):
    edit_json(d, depth="64")


def json_depth_huge(d):
    edit_json(d, depth=10**9)


def json_token_count(d):
    edit_json(d, tokens=12345)


def json_target_not_object(d):
    edit_json(d, target="toy")


def json_vocab_negative(d):
    edit_json(d, target={"name": "toy", "vocab_size": -1})


def json_vocab_bool(d):
    edit_json(d, target={"name": "toy", "vocab_size": True})


def json_fingerprint_strings(d):
    edit_json(d, target={"name": "toy", "vocab_size": VOCAB, "fingerprint": ["a", "b"]})


def json_calibration_string(d):
    edit_json(d, calibration={"index": {"smooth": "x", "half": 8.0}})


def json_calibration_nan(d):
    (d / "index.json").write_text(
        (d / "index.json")
        .read_text()
        .replace('"target"', '"calibration": {"counts": {"smooth": NaN, "half": 1}}, "target"', 1)  # fmt: skip
    )


def json_calibration_negative(d):
    edit_json(d, calibration={"index": {"smooth": 1.0, "half": -1.0}})


HOSTILE = [
    (sa_of_2_30, "sa.npy", "entry 1,073,741,824 at 0 is outside the"),
    (sa_negative, "sa.npy", "entry -5 at 3 is outside the"),
    (sa_longer, "sa.npy", "expected one per token of tokens.npy"),
    (tokens_shorter, "sa.npy", "expected one per token of tokens.npy"),
    (tokens_cut_mid_sequence, "tokens.npy", "expected a separator"),
    (tokens_float, "tokens.npy", "dtype float32, expected uint16 or uint32"),
    (sa_int8, "sa.npy", "dtype int8, expected int32"),
    (sa_int64, "sa.npy", "dtype int64, expected int32"),
    (sa_big_endian, "sa.npy", "dtype >i4, expected int32"),
    (tokens_pickled, "tokens.npy", "dtype object (pickled Python objects, never loaded)"),
    (sa_rank_2, "sa.npy", "expected one dimension"),
    (tokens_fortran_order, "tokens.npy", "in Fortran order, expected one dimension"),
    (sa_reversed, "sa.npy", "out of order, expected sorted suffixes"),
    (sa_swapped, "sa.npy", "out of order, expected sorted suffixes"),
    (sa_duplicate, "sa.npy", "the same position twice"),
    (sa_points_at_separator, "sa.npy", "one points at a separator"),
    (token_over_vocab, "tokens.npy", f"token id {VOCAB + 7} at 2 is outside the vocabulary ({VOCAB} ids)"),
    (truncated_npy, "sa.npy", "truncated"),
    (trailing_bytes, "tokens.npy", "trailing bytes"),
    (header_claims_huge_shape, "sa.npy", "truncated"),
    (header_garbage, "sa.npy", "not an .npy file"),
    (not_npy, "tokens.npy", "not an .npy file"),
    (empty_tokens, "tokens.npy", "not an .npy file"),
    (empty_sa, "sa.npy", "not an .npy file"),
    (json_corrupt, "index.json", "not valid JSON"),
    (json_not_utf8, "index.json", "not valid JSON"),
    (json_list, "index.json", "holds a JSON list, expected an object"),
    (json_deep, "index.json", "not valid JSON"),
    (json_huge, "index.json", "expected an index.json of a few KB"),
    (json_other_format, "index.json", "format is 'gguf', expected 'specwise-suffix-index'"),
    (json_newer_version, "index.json", "format version 99 is newer than this specwise's (1): upgrade specwise"),
    (json_version_string, "index.json", "format_version is '1', expected an integer"),
    (json_depth_string, "index.json", "depth is '64', expected an integer in 1..1024"),
    (json_depth_huge, "index.json", "depth is 1000000000, expected an integer in 1..1024"),
    (json_token_count, "index.json", "records 12345 tokens"),
    (json_target_not_object, "index.json", "target is 'toy', expected a JSON object"),
    (json_vocab_negative, "index.json", "target.vocab_size is -1, expected an integer"),
    (json_vocab_bool, "index.json", "target.vocab_size is True, expected an integer"),
    (json_fingerprint_strings, "index.json", "target.fingerprint[0] is 'a', expected a finite number"),
    (json_calibration_string, "index.json", "calibration.index.smooth is 'x', expected a finite number >= 0"),
    (json_calibration_nan, "index.json", "calibration.counts.smooth is nan, expected a finite number"),
    (json_calibration_negative, "index.json", "calibration.index.half is -1.0, expected a finite number >= 0"),
]


@pytest.mark.parametrize("mutate, name, says", HOSTILE, ids=[h[0].__name__ for h in HOSTILE])
def test_a_hostile_index_is_refused_in_one_line(index_dir, mutate, name, says):
    mutate(index_dir)
    with pytest.raises(IndexFileError) as err:
        load_index(index_dir)
    message = str(err.value)
    assert message.startswith(f"{index_dir / name}: ") and says in message
    assert "\n" not in message and len(message) < 300
    assert UNPICKLED == []


@pytest.mark.parametrize("name", ["tokens.npy", "sa.npy", "index.json"])
def test_a_missing_file_is_refused(index_dir, name):
    (index_dir / name).unlink()
    with pytest.raises(IndexNotFoundError) as err:  # also a FileNotFoundError and an IndexFileError
        load_index(index_dir)
    assert isinstance(err.value, FileNotFoundError) and isinstance(err.value, IndexFileError)
    assert name in str(err.value) and "\n" not in str(err.value)


def test_a_large_unsorted_index_is_refused_by_the_spot_check(tmp_path):
    rng = random.Random(5)
    seqs = [[rng.randrange(5000) for _ in range(rng.randrange(5, 60))] for _ in range(300)]
    SuffixIndex.from_sequences(seqs).save(tmp_path / "idx")
    assert len(load_index(tmp_path / "idx")) > 256 * 10  # more pairs than are checked
    rng = np.random.default_rng(0)
    sa = np.load(tmp_path / "idx" / "sa.npy")
    np.save(tmp_path / "idx" / "sa.npy", rng.permutation(sa).astype(np.int32))
    with pytest.raises(IndexFileError, match="out of order"):
        load_index(tmp_path / "idx")


def test_token_ids_are_checked_against_the_targets_vocabulary(index_dir):
    target = SimpleNamespace(name="toy", model=SimpleNamespace(vocab_size=VOCAB), hf_model=None)
    assert len(make_suffix_drafter(str(index_dir), target).index) == len(load_index(index_dir))
    tokens = np.load(index_dir / "tokens.npy")
    tokens[0] = VOCAB  # one past the last id
    np.save(index_dir / "tokens.npy", tokens)
    with pytest.raises(IndexFileError, match=f"token id {VOCAB} at 0 is outside the vocabulary"):
        make_suffix_drafter(str(index_dir), target)


def test_uint32_token_ids_are_checked_too(tmp_path):
    seqs = [[70_000, 70_001, 70_002], [5, 70_001, 9]]
    info = {"target": {"name": "big", "vocab_size": 80_000}}
    SuffixIndex.from_sequences(seqs, info=info).save(tmp_path / "big")
    assert np.load(tmp_path / "big" / "tokens.npy").dtype == np.uint32
    assert load_index(tmp_path / "big").sequences() == seqs
    tokens = np.load(tmp_path / "big" / "tokens.npy")
    tokens[1] = 90_000
    np.save(tmp_path / "big" / "tokens.npy", tokens)
    with pytest.raises(IndexFileError, match="token id 90,000 at 1 is outside the vocabulary"):
        load_index(tmp_path / "big")


def test_valid_indexes_load(tmp_path, index_dir):
    loaded = load_index(index_dir)
    assert loaded.text.dtype == np.uint32 and loaded.text[-1] == SEP and loaded.text.flags.c_contiguous
    SuffixIndex.from_sequences([]).save(tmp_path / "empty")
    assert len(load_index(tmp_path / "empty")) == 0
    SuffixIndex.from_sequences([[3]]).save(tmp_path / "one")
    assert load_index(tmp_path / "one").sequences() == [[3]]


# ---- the shipped index drafts as before -------------------------------------------------------------------------

# sha256 of the drafts of the shipped index for the contexts of shipped_drafts(), before the checks were added
# (the same native and in Python); they change when the shipped index is rebuilt
SHIPPED_DRAFTS = {
    "long": "1cb41f15d51f14b6370489c43aa8bfbcdb35a8cea0e4098c6a79992bb6ed074d",
    "short": "ea68891d6a204d3a059bc6ff3b1d0f75c456f13a52a2fa2e7e22feb3a6aa28b3",
}


def shipped_drafts(index: SuffixIndex, kind: str) -> str:
    """sha256 of (match, draft) for contexts cut from the index's own sequences: whole prefixes ("long" matches)
    or their last 2 to 4 tokens ("short": wide ranges, sampled continuations)."""
    seqs = index.sequences()
    rng = random.Random(0 if kind == "long" else 1)
    out = []
    for _ in range(200 if kind == "long" else 300):
        seq = rng.choice(seqs)
        context = seq[: rng.randrange(1, len(seq) + 1)]
        if kind == "short":
            context = context[-rng.randrange(2, 5) :]
        match = index.match(context, 24, 2)
        out.append([list(match), *index.draft(match, 8, 0.0, 4.0, 8.0)])
    return hashlib.sha256(json.dumps(out).encode()).hexdigest()


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_the_shipped_index_loads_and_drafts_as_before(native):
    if native and native_lib() is None:
        pytest.skip("the native kernels are not built")
    directory = shipped_index_dir("SmolLM2-135M-Instruct")
    assert directory is not None
    index = load_index(directory, native=native)
    for kind, digest in SHIPPED_DRAFTS.items():
        assert shipped_drafts(index, kind) == digest, f"{kind} drafts differ (or the shipped index was rebuilt)"


# ---- the native entry points check their arguments --------------------------------------------------------------


@pytest.fixture
def lib():
    lib = native_lib()
    if lib is None:
        pytest.skip("the native kernels are not built")
    return lib


def ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def native_match(lib, text, sa, context, min_len=1, n=None, m=None):
    """specwise_suffix_match's return value and range, sizes as given (default: the arrays')."""
    ctx = np.asarray(context, dtype=np.uint32)
    span = np.zeros(2, dtype=np.int64)
    n = len(text) if n is None else n
    m = len(sa) if m is None else m
    length = lib.specwise_suffix_match(ptr(text), n, ptr(sa), m, ptr(ctx), len(ctx), min_len, ptr(span), ptr(span) + 8)
    return length, tuple(span.tolist())


def native_draft(lib, text, sa, lo, hi, depth, k=4, n=None, m=None, scan=32, capacity=None, structs=()):
    """specwise_suffix_draft's return value and tokens, sizes as given (default: the arrays'); ``structs``: those
    of "index", "opts", "out" passed as NULL."""
    out = (np.zeros(max(k, 1), np.int32), np.zeros(max(k, 1), np.float32), np.zeros(2 * max(k, 1), np.int64))
    n = len(text) if n is None else n
    m = len(sa) if m is None else m
    index = SfxIndex(ptr(text), n, ptr(sa), m)
    opts = SfxDraft(depth, 64, k, 0.0, 1.0, 2.0, scan)
    outs = SfxOut(*(ptr(a) for a in out), max(k, 1) if capacity is None else capacity)
    args = [None if name in structs else ctypes.pointer(s) for name, s in (("index", index), ("opts", opts),
                                                                             ("out", outs))]  # fmt: skip
    return lib.specwise_suffix_draft(args[0], lo, hi, args[1], args[2]), out[0]


def test_native_search_refuses_entries_outside_the_text(lib):
    index = SuffixIndex.from_sequences([[1, 2, 3], [2, 3, 4]])
    text, sa = index.text, index.sa
    assert native_match(lib, text, sa, [2, 3]) == (2, (1, 3))  # the valid index: found
    for bad in (np.full(len(sa), 1 << 30, np.int32), np.full(len(sa), -7, np.int32), np.full(len(sa), 8, np.int32)):
        assert native_match(lib, text, bad, [2, 3])[0] == -1  # 8 == n: one past the text
        assert native_draft(lib, text, bad, 0, len(sa), 1)[0] == -1
    negative = sa.copy()
    negative[len(sa) // 2] = -1  # the first probe of the bisection
    assert native_match(lib, text, negative, [2, 3])[0] == -1


def test_native_search_refuses_sizes_and_ranges_out_of_bounds(lib):
    index = SuffixIndex.from_sequences([[1, 2, 3], [2, 3, 4]])
    text, sa = index.text, index.sa
    n, m = len(text), len(sa)
    assert native_match(lib, text, sa, [2, 3], n=-1)[0] == -1
    assert native_match(lib, text, sa, [2, 3], m=-1)[0] == -1
    assert native_match(lib, text, sa, [2, 3], n=m - 1)[0] == -1  # more entries than tokens
    assert native_draft(lib, text, sa, 1, 3, 2)[0] == 1  # a valid range: [2, 3] -> 4 (then the ends)
    for lo, hi, depth in ((-1, 3, 2), (2, 1, 2), (0, m + 1, 2), (1, 3, -1), (1, 3, n + 1)):
        assert native_draft(lib, text, sa, lo, hi, depth)[0] == -1, (lo, hi, depth)
    assert native_draft(lib, text, sa, 1, 3, 2, k=-1)[0] == -1
    assert native_draft(lib, text, sa, 1, 3, 2, scan=0)[0] == -1
    assert native_draft(lib, text, sa, 1, 3, 2, m=m, n=m - 1)[0] == -1
    before = native_draft(lib, text, sa, 1, 3, 2, k=1)
    assert before[0] == 1
    assert native_draft(lib, text, sa, 1, 3, 2, k=2, capacity=1)[0] == -1  # more tokens than the outputs hold
    assert native_draft(lib, text, sa, 1, 3, 2, k=0, capacity=0)[0] == 0
    for missing in ("index", "opts", "out"):
        result, tokens = native_draft(lib, text, sa, 1, 3, 2, structs=(missing,))
        assert result == -1 and not tokens.any(), missing  # refused, nothing written


def test_native_search_stops_at_the_end_of_a_text_without_a_separator(lib):
    text = np.array([5, 6], dtype=np.uint32)  # no final separator: a comparison must stop at n
    sa = np.array([0, 1], dtype=np.int32)
    assert native_match(lib, text, sa, [5, 6])[0] == 2
    assert native_match(lib, text, sa, [6, 9], min_len=2)[0] == 0  # [6] then the end: shorter, sorts first
    assert native_draft(lib, text, sa, 1, 2, 1)[0] == -1  # the token after the last: outside the text


def test_a_bad_index_built_in_memory_is_refused_by_the_native_search(lib):
    index = SuffixIndex.from_sequences([[1, 2, 3], [2, 3, 4]])
    bad = SuffixIndex(index.text, np.full(len(index.sa), 1 << 30, np.int32))  # not through load_index
    with pytest.raises(IndexFileError, match="the native search was refused"):
        bad.match([2, 3], 24, 1)
