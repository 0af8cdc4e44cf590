"""Draft vocabularies (specwise.drafters.vocab): a draft model's output layer over a subset of the vocabulary, the
ranking files that choose the subset, the `model:ID?vocab=N` spec, and `--drafter auto`'s sibling draft model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf_raw import ARRAY, STRING, tiny_model
from test_engine import LENGTH, VOCAB, chi2_pvalue, exact_joint, run_many

from specwise.artifacts import SHIPPED, DraftVocabError, fingerprint, read_ranking, write_ranking
from specwise.drafters import ModelDrafter, NgramDrafter, NoDrafter, make_drafter, resolve_drafter_spec
from specwise.drafters.sibling import auto_model_spec, find_sibling, missing_sibling_hint
from specwise.drafters.vocab import draft_vocabulary, parse_model_spec
from specwise.engine import Engine
from specwise.lab.ranking import rank_tokens
from specwise.models.base import Model
from specwise.models.toy import ToyModel
from specwise.sampling import SamplingParams, make_generator

pytestmark = pytest.mark.usefixtures("one_thread")

gguf = pytest.importorskip("gguf")
from test_quantized_model import VARIANTS, sequence, write_gguf  # noqa: E402

from specwise.models.quantized import QuantizedModel  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module", params=["llama-Q8_0", "llama-K", "qwen2-Q5_1", "llama-Q4_1"])
def tiny(request, tmp_path_factory):
    """(path, spec) of a tiny GGUF model: tied or not, output layers in formats drafting narrows or keeps."""
    spec = VARIANTS[request.param]
    path = tmp_path_factory.mktemp("vocab") / f"{request.param}.gguf"
    write_gguf(path, spec)
    return path, spec


def subset(vocab: int, n: int, seed: int = 0) -> np.ndarray:
    """``n`` distinct token ids in a shuffled order (column j of a restricted model is token ids[j])."""
    return np.random.default_rng(seed).permutation(vocab)[:n]


# ---- the output layer over a subset --------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["exact", "q8"])
@pytest.mark.parametrize("drafting", [False, True])
def test_subset_logits_equal_the_full_models_at_those_ids(tiny, precision, drafting):
    path, spec = tiny
    ids = subset(spec.vocab, 37)
    full = QuantizedModel(path, precision=precision, drafting=drafting)
    part = QuantizedModel(path, precision=precision, drafting=drafting)
    part.restrict_output(ids)
    assert part.vocab_size == 37 and full.vocab_size == spec.vocab
    assert part.lm_head.type_name == full.lm_head.type_name  # the same rows, re-packed (and narrowed) alike
    tokens = np.asarray(sequence(spec, 12), dtype=np.int64)
    want = full.forward(tokens)[:, ids]
    got = part.forward(tokens)  # [12, 37]
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)
    # a pass shared with another sequence (forward_batch): the same numbers
    other = part.sequence()
    more = np.asarray(sequence(spec, 5, seed=3), dtype=np.int64)
    part.rollback(0)
    got_a, got_b = part.forward_batch([(part, tokens), (other, more)], [None, 2])
    np.testing.assert_array_equal(got_a, want)
    full.rollback(0)
    np.testing.assert_array_equal(got_b, full.forward(more)[-2:, ids])


def test_restrict_output_refuses_bad_ids(tiny):
    path, spec = tiny
    model = QuantizedModel(path)
    for bad in ([], [0, 0], [-1], [spec.vocab]):
        with pytest.raises(ValueError, match="distinct token ids"):
            model.restrict_output(bad)
    assert model.vocab_size == spec.vocab  # unchanged


def greedy(engine: Engine, prompt: list[int], n: int = 40):
    return engine.generate(prompt, GREEDY, max_new_tokens=n, eos_token_ids=[])


def subset_drafter(path, ids, **kw) -> ModelDrafter:
    model = QuantizedModel(path, **kw)
    full = model.vocab_size
    model.restrict_output(ids)
    return ModelDrafter(model, np.asarray(ids), full)


def test_greedy_speculative_with_a_draft_vocabulary_equals_plain(tiny):
    path, spec = tiny
    target = QuantizedModel(path)
    for prompt in ([1, 5, 9, 2], sequence(spec, 20, seed=11)):
        plain = greedy(Engine(target, NoDrafter()), prompt).token_ids
        # the whole vocabulary in another order: the draft is the target, every token accepted (a wrong mapping
        # from columns to token ids would be rejected)
        everything = greedy(Engine(target, subset_drafter(path, subset(spec.vocab, spec.vocab)), gamma=4), prompt)
        assert everything.token_ids == plain
        assert everything.stats.acceptance_rate == 1.0
        # a third of the vocabulary, narrowed: tokens outside it are never drafted, the output stays plain's
        part = subset(spec.vocab, spec.vocab // 3, seed=5)
        drafter = subset_drafter(path, part, drafting=True)
        run = greedy(Engine(target, drafter, gamma=4), prompt)
        assert run.token_ids == plain
        assert run.stats.drafted > 0
        drafter.begin(prompt)
        draft = drafter.propose(list(prompt), 4, GREEDY, None)
        assert set(draft.ids) <= set(part.tolist())


class SubsetModel(Model):
    """A model's logits at ``ids`` only (column j: token ids[j]): what restrict_output gives, for any model."""

    def __init__(self, inner: Model, ids: list[int]) -> None:
        self.inner, self.ids = inner, np.asarray(ids, dtype=np.int64)
        self.device, self.vocab_size = inner.device, len(ids)
        self.max_length = inner.max_length

    @property
    def length(self) -> int:
        return self.inner.length

    def rollback(self, length: int) -> None:
        self.inner.rollback(length)

    def reset(self) -> None:
        self.inner.reset()

    def forward(self, tokens, num_logits=None):
        return np.ascontiguousarray(self.inner.forward(tokens, num_logits)[:, self.ids])


@pytest.mark.parametrize(("setting", "gamma"), [("t1", 2), ("t07-topk3", 3), ("topp-minp", 3)])
def test_sampled_output_with_a_draft_vocabulary_follows_the_target(setting, gamma):
    """Sampling: q over the draft vocabulary placed in the full one (token 1 is never drafted); the emitted
    sequences follow the target's joint distribution."""
    from test_engine import SETTINGS

    params = SETTINGS[setting]
    target = ToyModel.random(VOCAB, seed=11)
    ids = [3, 0, 2]
    drafter = ModelDrafter(SubsetModel(ToyModel.random(VOCAB, seed=12), ids), np.asarray(ids), VOCAB)
    n = 6000
    counts = run_many(Engine(target, drafter, gamma=gamma), params, n)
    pvalue = chi2_pvalue(counts, exact_joint(target, [1], params, LENGTH), n)
    assert pvalue > 1e-4, f"emitted sequences do not follow p (chi-square p-value {pvalue:.2e})"


def test_sampled_q_is_zero_outside_the_draft_vocabulary():
    ids = [3, 0, 2]
    drafter = ModelDrafter(SubsetModel(ToyModel.random(VOCAB, seed=12), ids), ids, VOCAB)
    drafter.begin([1])
    draft = drafter.propose([1], 3, SamplingParams(temperature=1.0), make_generator(0))
    assert isinstance(draft.probs, np.ndarray) and draft.probs.dtype == np.float32
    assert draft.probs.shape == (3, VOCAB)
    assert np.all(draft.probs[:, 1] == 0)
    np.testing.assert_allclose(draft.probs.sum(-1), np.ones(3), rtol=1e-6)
    assert draft.tokens.dtype == np.int64
    for token, q in zip(draft.ids, draft.probs):
        assert token in ids and q[token] > 0


def test_a_draft_vocabulary_must_match_the_models_logits():
    model = ToyModel.random(VOCAB, seed=1)
    with pytest.raises(ValueError, match="draft vocabulary of 2 ids"):
        ModelDrafter(model, np.asarray([0, 1]), VOCAB)


# ---- ranking files -------------------------------------------------------------------------------------------


def test_ranking_round_trip_and_draft_vocabulary(tmp_path):
    path = tmp_path / "rank.npy"
    write_ranking(path, [5, 1, 7, 0, 3])
    assert read_ranking(path, 10).tolist() == [5, 1, 7, 0, 3]
    assert draft_vocabulary(3, path, None, 10).tolist() == [1, 5, 7]  # the first 3, sorted
    assert draft_vocabulary(2, path, None, 10, always=[9]).tolist() == [1, 5, 9]  # EOS added where missing
    assert draft_vocabulary(None, path, None, 10).tolist() == [0, 1, 3, 5, 7]


def _npy(path, array) -> str:
    np.save(path, array, allow_pickle=True)
    return str(path)


HOSTILE = {
    "pickled objects": (lambda p: _npy(p, np.array([1, "x", None], dtype=object)), "pickled"),
    "floats": (lambda p: _npy(p, np.array([1.0, 2.0])), "dtype float64"),
    "two dimensions": (lambda p: _npy(p, np.zeros((2, 2), dtype=np.int32)), "one dimension"),
    "empty": (lambda p: _npy(p, np.zeros(0, dtype=np.uint32)), "no token ids"),
    "id past the vocabulary": (lambda p: _npy(p, np.array([1, 10], dtype=np.uint32)), "token id 10 is outside"),
    "negative id": (lambda p: _npy(p, np.array([1, -1], dtype=np.int64)), "token id -1 is outside"),
    "repeated id": (lambda p: _npy(p, np.array([4, 2, 4], dtype=np.int32)), "token id 4 appears more than once"),
    "too many ids": (lambda p: _npy(p, np.arange(11, dtype=np.int32)), "more than the target's vocabulary"),
    "not an npy file": (lambda p: p.write_text("[1, 2, 3]") and str(p), "not an .npy file"),
    "truncated": (lambda p: p.write_bytes(_truncated(p)) and str(p), "truncated"),
}


def _truncated(p) -> bytes:
    np.save(p, np.arange(8, dtype=np.uint32))
    return p.read_bytes()[:-6]


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_ranking_file_is_refused_in_one_line(tmp_path, case):
    make, what = HOSTILE[case]
    path = tmp_path / "rank.npy"
    make(path)
    with pytest.raises(DraftVocabError) as err:
        read_ranking(path, 10)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and what in message
    assert "python -m specwise.lab.ranking" in message  # the fix


def test_missing_file_and_sizes_are_refused(tmp_path):
    with pytest.raises(DraftVocabError, match="no such file"):
        read_ranking(tmp_path / "none.npy", 10)
    path = tmp_path / "rank.npy"
    write_ranking(path, [5, 1, 7])
    with pytest.raises(DraftVocabError, match="ranks 3 token ids, fewer than the draft vocabulary of 4"):
        draft_vocabulary(4, path, None, 10)
    with pytest.raises(DraftVocabError, match="give 1 to 10"):
        draft_vocabulary(11, path, None, 10)
    with pytest.raises(DraftVocabError, match="no draft vocabulary ranking is shipped"):
        draft_vocabulary(2, None, None, 10)


def test_rank_tokens_orders_by_source_then_id():
    answers = np.array([0, 5, 0, 5, 1, 0])
    texts = np.array([9, 0, 3, 1, 0, 0])
    ranked = rank_tokens([answers, texts], 6, always=[5])
    # 5 first (always), then 3 and 1 (5 answers each, 3 more frequent in texts), 4, then 0, 2 (texts), ...
    assert ranked.tolist() == [5, 3, 1, 4, 0, 2]
    assert rank_tokens([answers, texts], 6, size=2).tolist() == [3, 1]


class Vocab:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens

    def get_vocab(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.tokens)}


def test_fingerprint_names_the_tokens_id_for_id():
    a = fingerprint(Vocab(["a", "b", "c"]))
    assert a == fingerprint(Vocab(["a", "b", "c"]))
    assert a != fingerprint(Vocab(["a", "c", "b"]))
    assert a != fingerprint(Vocab(["a", "b", "c", "d"]))


def test_shipped_rankings_are_valid():
    """Every ranking shipped is read by the checked reader and offers the draft vocabulary `auto` asks for (or the
    whole vocabulary, where it is smaller), and the one `self` takes by default."""
    from specwise.drafters.self_draft import DEFAULT_VOCAB
    from specwise.drafters.sibling import DRAFT_VOCAB_SIZE

    shipped = sorted((SHIPPED / "vocabs").glob("*.npy"))
    for path in shipped:
        raw = np.load(path, allow_pickle=False)
        ids = read_ranking(path, int(raw.max()) + 1)
        assert len(ids) >= DRAFT_VOCAB_SIZE or len(ids) == int(raw.max()) + 1
        assert len(ids) >= DEFAULT_VOCAB
        assert len(path.stem) == 16 and int(path.stem, 16) >= 0


# ---- the drafter spec ----------------------------------------------------------------------------------------


def test_parse_model_spec():
    assert parse_model_spec("a/b.gguf") == ("a/b.gguf", {})
    assert parse_model_spec("a/b.gguf?vocab=32768") == ("a/b.gguf", {"vocab": "32768"})
    assert parse_model_spec("b.gguf?vocab=8&ranking=r.npy") == ("b.gguf", {"vocab": "8", "ranking": "r.npy"})
    assert parse_model_spec("b.gguf?ranking=r.npy") == ("b.gguf", {"vocab": "all", "ranking": "r.npy"})
    for bad in ("b.gguf?size=3", "b.gguf?vocab", "b.gguf?vocab=", "b.gguf?vocab=1&vocab=2"):
        with pytest.raises(ValueError, match="drafter option"):
            parse_model_spec(bad)


class Loaded:
    def __init__(self, model, tokenizer=None, name="tiny") -> None:
        self.model, self.tokenizer, self.name, self.hf_model = model, tokenizer, name, None
        self.eos_token_ids = None


def _fake_loader(monkeypatch):
    import specwise.models.loader as loader

    monkeypatch.setattr(loader, "load_model", lambda arg, **kw: Loaded(QuantizedModel(arg, drafting=kw["drafting"])))


def test_make_drafter_with_a_draft_vocabulary(tiny, tmp_path, monkeypatch):
    path, spec = tiny
    _fake_loader(monkeypatch)
    ranking = tmp_path / "rank.npy"
    write_ranking(ranking, subset(spec.vocab, 30, seed=2))
    target = Loaded(QuantizedModel(path))
    [drafter] = make_drafter(f"model:{path}?vocab=20&ranking={ranking}", target)
    want = np.sort(np.load(ranking)[:20])
    assert drafter.vocab_ids.tolist() == want.tolist()
    assert drafter.model.vocab_size == 20 and drafter.vocab_size == spec.vocab
    prompt = sequence(spec, 16, seed=4)
    plain = greedy(Engine(target.model, NoDrafter()), prompt).token_ids
    assert greedy(Engine(target.model, [NgramDrafter(), drafter], gamma="auto"), prompt).token_ids == plain
    [staged] = make_drafter(f"model:{path}?vocab=20&ranking={ranking}&lookup=3", target)
    assert staged.lookup is not None and staged.lookup.max_ngram == 3
    assert greedy(Engine(target.model, staged, gamma=5), prompt).token_ids == plain
    [whole] = make_drafter(f"model:{path}?ranking={ranking}", target)
    assert whole.model.vocab_size == 30
    with pytest.raises(ValueError, match="vocab='x'"):
        make_drafter(f"model:{path}?vocab=x&ranking={ranking}", target)
    with pytest.raises(DraftVocabError, match="fewer than the draft vocabulary of 31"):
        make_drafter(f"model:{path}?vocab=31&ranking={ranking}", target)
    with pytest.raises(DraftVocabError, match="no draft vocabulary ranking is shipped"):
        make_drafter(f"model:{path}?vocab=20", target)
    with pytest.raises(ValueError, match="name the draft model"):
        make_drafter("model:?vocab=20", target)


def test_a_draft_vocabulary_needs_the_quantized_model(monkeypatch, tmp_path):
    import specwise.models.loader as loader

    ranking = tmp_path / "rank.npy"
    write_ranking(ranking, [0, 1])
    monkeypatch.setattr(loader, "load_model", lambda arg, **kw: Loaded(ToyModel.random(VOCAB, seed=1)))
    with pytest.raises(ValueError, match="needs a GGUF draft model on the CPU"):
        make_drafter(f"model:toy?vocab=2&ranking={ranking}", Loaded(ToyModel.random(VOCAB, seed=2)))


# ---- --drafter auto: a sibling draft model -------------------------------------------------------------------


def _write(path, g) -> str:
    path.write_bytes(g.bytes())
    return str(path)


def _one_layer(g):
    """The tiny model with its second layer dropped: a smaller sibling of the same vocabulary."""
    g = g.copy()
    g.tensors = [t for t in g.tensors if not t.name.startswith("blk.1.")]
    from gguf_raw import U32

    return g.set("llama.block_count", U32, 1)


def _named(g, basename: str):
    return g.copy().set("general.basename", STRING, basename)


def test_find_sibling_takes_a_smaller_model_of_the_same_vocabulary(tmp_path):
    base = _named(tiny_model(), "Tiny")
    target = _write(tmp_path / "target.gguf", base)
    folder = tmp_path / "cache"
    folder.mkdir()
    assert find_sibling(target, [folder]) is None
    other_vocab = _one_layer(base).set("tokenizer.ggml.tokens", ARRAY, (STRING, [f"u{i}" for i in range(96)]))
    _write(folder / "a-other-vocab.gguf", other_vocab)
    _write(folder / "b-same-size.gguf", base)
    (folder / "c-broken.gguf").write_bytes(b"GGUF\x03\x00")
    assert find_sibling(target, [folder]) is None  # a different vocabulary, not smaller, not a GGUF file
    other_family = _write(folder / "d-other-family.gguf", _named(_one_layer(base), "Else"))
    assert find_sibling(target, [folder]) == folder / "d-other-family.gguf" == type(folder)(other_family)
    _write(folder / "e-sibling.gguf", _one_layer(base))
    assert find_sibling(target, [folder]) == folder / "e-sibling.gguf"  # its own family first
    assert auto_model_spec(target, None, [folder]) == f"ngram+model:{folder / 'e-sibling.gguf'}"


def test_find_sibling_reads_the_token_list_only_for_a_candidate(tmp_path, monkeypatch):
    """The target's token list (262,144 strings for Gemma 3) is read only when a smaller file of the same
    vocabulary size is there to compare it with."""
    import specwise.drafters.sibling as sibling

    base = _named(tiny_model(), "Tiny")
    target = _write(tmp_path / "target.gguf", base)
    folder = tmp_path / "cache"
    folder.mkdir()
    _write(folder / "same-size.gguf", base)
    read = []
    tokens = sibling._tokens
    monkeypatch.setattr(sibling, "_tokens", lambda meta: read.append(1) or tokens(meta))
    assert find_sibling(target, [folder]) is None and read == []
    _write(folder / "smaller.gguf", _one_layer(base))
    assert find_sibling(target, [folder]) == folder / "smaller.gguf" and len(read) == 2


def test_auto_uses_the_sibling_in_the_fetch_cache(tmp_path, monkeypatch):
    import specwise.files

    base = _named(tiny_model(), "Tiny")
    target_path = _write(tmp_path / "target.gguf", base)
    folder = tmp_path / "gguf"
    folder.mkdir()
    _write(folder / "sibling.gguf", _one_layer(base))
    monkeypatch.setattr(specwise.files, "gguf_dir", lambda cache=None: folder)
    target = Loaded(QuantizedModel(target_path), name="target")
    assert resolve_drafter_spec("auto", target) == f"ngram+model:{folder / 'sibling.gguf'}"
    assert resolve_drafter_spec("ngram", target) == "ngram"


def test_auto_finds_a_sibling_beside_the_target_by_its_metadata_not_its_name(tmp_path, monkeypatch):
    """A smaller model of the target's vocabulary in the target's own folder, under any name, is the sibling; a
    file at least as large as the target is never opened, and a bounded number of headers is read."""
    import specwise.drafters.sibling as sibling
    import specwise.files

    base = _named(tiny_model(), "Tiny")
    folder = tmp_path / "models"
    folder.mkdir()
    target_path = _write(folder / "Target Model (final).gguf", base)
    empty = tmp_path / "cache"
    empty.mkdir()
    monkeypatch.setattr(specwise.files, "gguf_dir", lambda cache=None: empty)
    target = Loaded(QuantizedModel(target_path), name="target")
    assert resolve_drafter_spec("auto", target) == "ngram"
    bigger = base.copy().set("general.name", STRING, "x" * 4096)  # the same model, a larger file
    _write(folder / "00-bigger.gguf", bigger)
    _write(folder / "01-other-vocab.gguf", _one_layer(base).set("tokenizer.ggml.tokens", ARRAY, (STRING, ["v"] * 96)))
    draft = _write(folder / "zz draft copy.gguf", _one_layer(base))
    (folder / "notes.txt").write_text("not a model")
    opened = []
    read = sibling._gguf
    monkeypatch.setattr(sibling, "_gguf", lambda path: opened.append(Path(path).name) or read(path))
    assert resolve_drafter_spec("auto", target) == f"ngram+model:{draft}"
    assert "00-bigger.gguf" not in opened and opened[0] == "Target Model (final).gguf"
    opened.clear()
    monkeypatch.setattr(sibling, "MAX_CANDIDATES", 1)  # only the first candidate's header is read
    assert find_sibling(target_path) is None and opened == ["Target Model (final).gguf", "01-other-vocab.gguf"]


def test_auto_without_a_sibling_says_how_to_get_one(tmp_path, monkeypatch, capsys):
    import specwise.files

    g = _named(tiny_model(), "Qwen2.5-Coder")
    target_path = _write(tmp_path / "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf", g)
    empty = tmp_path / "gguf"
    empty.mkdir()
    monkeypatch.setattr(specwise.files, "gguf_dir", lambda cache=None: empty)
    hint = missing_sibling_hint(target_path)
    assert "python -m specwise.lab.bench.fetch qwen2.5-coder-0.5b-instruct" in hint and "\n" not in hint
    assert resolve_drafter_spec("auto", Loaded(QuantizedModel(target_path), name="q")) == "ngram"
    assert capsys.readouterr().err.strip() == f"specwise: {hint}"
    unknown = _write(tmp_path / "Tiny-1B.gguf", _named(tiny_model(), "Tiny"))
    assert missing_sibling_hint(unknown) is None


# ---- the ranking's builder -----------------------------------------------------------------------------------


def test_builder_prompts_take_the_files_in_turn_and_answers_resume(tmp_path):
    import json

    from specwise.lab.ranking import read_answers, sampled_prompts

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps({"prompt": f"a{i}\u2028x"}) + "\n" for i in range(5)))
    b.write_text("".join(json.dumps({"prompt": f"b{i}"}) + "\n" for i in range(2)))
    prompts = sampled_prompts([a, b], 3, seed=0)
    assert [p[0] for p in prompts] == ["a", "b", "a", "b", "a"]  # in turn, until a file runs out
    assert prompts == sampled_prompts([a, b], 3, seed=0) and len(set(prompts)) == 5
    saved = tmp_path / "answers.jsonl"
    assert read_answers(saved) == []
    saved.write_text("[1, 2]\n[3]\n[4, 5")  # a run stopped while writing its last line
    assert read_answers(saved) == [[1, 2], [3]]


def test_auto_gives_the_sibling_the_shipped_draft_vocabulary(tmp_path, monkeypatch):
    """With a ranking shipped for the target's tokenizer, `auto` drafts from its first DRAFT_VOCAB_SIZE tokens."""
    import specwise.artifacts as artifacts
    from specwise.drafters.sibling import DRAFT_VOCAB_SIZE

    base = _named(tiny_model(), "Tiny")
    target = _write(tmp_path / "target.gguf", base)
    folder = tmp_path / "cache"
    folder.mkdir()
    _write(folder / "sibling.gguf", _one_layer(base))
    tokenizer = Vocab([f"t{i}" for i in range(96)])
    monkeypatch.setattr(artifacts, "SHIPPED", tmp_path / "shipped")
    assert auto_model_spec(target, tokenizer, [folder]) == f"ngram+model:{folder / 'sibling.gguf'}"
    (tmp_path / "shipped" / "vocabs").mkdir(parents=True)
    write_ranking(tmp_path / "shipped" / "vocabs" / f"{fingerprint(tokenizer)[:16]}.npy", range(96))
    want = f"ngram+model:{folder / 'sibling.gguf'}?vocab={DRAFT_VOCAB_SIZE}"
    assert auto_model_spec(target, tokenizer, [folder]) == want


class CharTokenizer(Vocab):
    """Token id = a character's code (below 100): enough for the builder's counts."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) % 100 for c in text]}


def test_builder_ranks_saved_answers_then_prompts_then_texts(tmp_path, monkeypatch, capsys, tiny):
    import json

    import specwise.models
    from specwise.lab.ranking import main

    path, spec = tiny
    loaded = Loaded(QuantizedModel(path), CharTokenizer([f"t{i}" for i in range(spec.vocab)]))
    loaded.eos_token_ids = {2}
    monkeypatch.setattr(specwise.models, "load_model", lambda *a, **k: loaded)
    answers, prompts, texts = tmp_path / "a.jsonl", tmp_path / "p.jsonl", tmp_path / "t.txt"
    answers.write_text("[7, 7, 9]\n[9, 7, 5]\n")
    prompts.write_text(json.dumps({"prompt": "QPP"}) + "\n")  # P = 80, Q = 81
    texts.write_text("QQQRR")  # R = 82: Q's count here only breaks ties among the prompts' tokens
    out = tmp_path / "r.npy"
    args = ["--target", "t", "--out", str(out), "--answers", str(answers), "--per-file", "0", "--size", "8"]
    assert main([*args, "--prompts", str(prompts), "--texts", str(texts)]) == 0
    assert read_ranking(out, spec.vocab).tolist() == [2, 7, 9, 5, 80, 81, 82, 0]
    assert main([*args, "--use-answers", "1"]) == 0
    assert read_ranking(out, spec.vocab).tolist()[:3] == [2, 7, 9]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt field"}\n')
    assert main([*args, "--prompts", str(bad)]) == 2
    assert main(["--target", "t", "--out", str(out), "--prompts", str(tmp_path / "none.jsonl")]) == 2
    errors = [line for line in capsys.readouterr().err.split("\n") if line.startswith("error: ")]
    assert len(errors) == 2 and "prompt" in errors[0] and "none.jsonl" in errors[1]


def test_fingerprint_reads_the_tokens_one_at_a_time(smol_tokenizer, monkeypatch):
    """The digest of the tokens in id order, read without building the vocabulary's dict (60 MB at Gemma 3's
    size): the same digest as the dict sorted by id, so shipped rankings keep their names."""
    whole = fingerprint(Vocab([smol_tokenizer.convert_ids_to_tokens(i) for i in range(len(smol_tokenizer))]))
    monkeypatch.setattr(type(smol_tokenizer), "get_vocab", lambda self: pytest.fail("the dict was built"))
    assert fingerprint(smol_tokenizer) == whole == "46c0542294848967" + whole[16:]
