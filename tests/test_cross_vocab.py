"""A draft model of another vocabulary (TLI and SLEM, specwise.drafters.cross_vocab): greedy output equal to plain
decoding on real vocabularies of three families, sampled output with the target's distribution, each tokenizer
boundary (a target token ending inside a draft token, byte-fallback tokens, added and special tokens, markers of
one vocabulary only), rollback, and `model:PATH` picking the method."""

from __future__ import annotations

import numpy as np
import pytest
from test_engine import chi2_pvalue, exact_joint
from vocab_models import GEMMA_TEMPLATE, GEMMA_VOCAB, tiny_vocab_gguf

from specwise.drafters import make_drafter
from specwise.drafters.cross_vocab import CrossVocabDrafter, TokenSpace, VocabularyPair
from specwise.engine import Engine
from specwise.models.base import Model
from specwise.models.toy import ToyModel
from specwise.sampling import SamplingParams, make_generator

pytestmark = pytest.mark.usefixtures("one_thread")

# ---- the vocabularies: Qwen2.5-Coder's and Gemma 3's (fixtures), SmolLM2's (the default model) ------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Tiny random GGUF models around three real vocabularies."""
    from specwise.models.loader import default_gguf_path

    folder = tmp_path_factory.mktemp("cross")
    return {
        "qwen": tiny_vocab_gguf(folder / "tiny-qwen.gguf"),
        "gemma": tiny_vocab_gguf(folder / "tiny-gemma.gguf", GEMMA_VOCAB, GEMMA_TEMPLATE),
        "smol": tiny_vocab_gguf(folder / "tiny-smol.gguf", default_gguf_path(), seed=1),
    }


@pytest.fixture(scope="module")
def loaded(files):
    from specwise.models import load_model

    return {name: load_model(str(path)) for name, path in files.items()}


@pytest.fixture(scope="module")
def spaces(loaded):
    return {name: TokenSpace.from_tokenizer(m.tokenizer, name) for name, m in loaded.items()}


def pair_of(spaces, target: str, draft: str, rows: dict | None = None) -> VocabularyPair:
    t, d = spaces[target], spaces[draft]
    return VocabularyPair(t, d, (rows or {}).get(target, t.size), (rows or {}).get(draft, d.size))


class TextModel(Model):
    """Writes ``doc`` in the tokens of ``space``: after tokens that spell a prefix of it, the logits favour the
    longest token that continues it by ``margin`` over noise; anywhere else (or at an offset in ``wrong``, where it
    favours a token of other text; or in ``split``, a shorter token of the right text) noise decides. The noise
    depends on the position only, so that rolling back and feeding again gives the same logits."""

    def __init__(self, space: TokenSpace, doc: bytes, seed: int = 0, margin: float = 12.0, wrong=(), split=()):
        self.space, self.doc, self.seed, self.margin = space, doc, seed, margin
        self.wrong, self.split = set(wrong), set(split)
        self.vocab_size = space.size
        self.device = "cpu"
        self.noise = np.random.Generator(np.random.Philox(seed)).standard_normal(space.size).astype(np.float32)
        self.tokens: list[int] = []
        self.spelled = [b""]  # the text of each prefix of the tokens

    def sequence(self) -> TextModel:
        return TextModel(self.space, self.doc, self.seed, self.margin, self.wrong, self.split)

    @property
    def length(self) -> int:
        return len(self.tokens)

    def _favoured(self, written: bytes) -> int | None:
        if not self.doc.startswith(written) or len(written) >= len(self.doc):
            return None
        at = len(written)
        rest = self.doc[at:]
        if at in self.wrong:
            return self.space.by_bytes[b"Z"]
        found = []
        for n in range(min(self.space.longest, len(rest)), 0, -1):
            token = self.space.by_bytes.get(rest[:n])
            if token is not None:
                found.append(token)
        if not found:
            return None
        return found[1] if at in self.split and len(found) > 1 else found[0]

    def _row(self, n: int) -> np.ndarray:
        row = np.roll(self.noise, (n * 7919) % self.vocab_size)
        favoured = self._favoured(self.spelled[n])
        if favoured is not None:
            row[favoured] += self.margin
        return row

    def forward(self, tokens, num_logits=None) -> np.ndarray:
        ids = self._check_forward(tokens).tolist()
        for t in ids:
            text = self.space.text[t] if 0 <= t < self.space.size else None
            self.tokens.append(t)
            self.spelled.append(self.spelled[-1] + (text or b""))
        k = len(ids) if num_logits is None else num_logits
        n = len(self.tokens)
        if not k:
            return np.empty((0, self.vocab_size), dtype=np.float32)
        return np.stack([self._row(i) for i in range(n - k + 1, n + 1)])

    def rollback(self, length: int) -> None:
        self._check_rollback(length)
        del self.tokens[length:]
        del self.spelled[length + 1 :]


DOC = (
    "def mean(values):\n"
    '    """The average of values, or 0.0 for none."""\n'
    "    if not values:\n"
    "        return 0.0\n"
    "    return sum(values) / len(values)\n\n"
    "Café au lait: 3,50 € — 東京で 🚀 naïve\tcoöperate   ok!!\n"
).encode()
PROMPT_BYTES = 12


def greedy(engine: Engine, prompt: list[int], n: int) -> list[int]:
    return engine.generate(prompt, SamplingParams(), max_new_tokens=n, eos_token_ids=[]).token_ids


@pytest.mark.parametrize("method", ["tli", "slem"])
@pytest.mark.parametrize(
    ("target", "draft"), [("qwen", "smol"), ("gemma", "smol"), ("smol", "gemma"), ("smol", "qwen")]
)
@pytest.mark.parametrize("restricted", [False, True])
def test_greedy_output_equals_plain_on_real_vocabularies(spaces, target, draft, method, restricted):
    """Token for token, on text with code, accents, a euro sign, CJK, an emoji, a tab and runs of spaces (which the
    vocabularies split differently), with a draft that writes the target's text (so that drafts are accepted), errs
    at a few places (rejections, rollback) and splits some words into shorter tokens than its tokenizer would; and
    with the draft model's output restricted to a draft vocabulary (every id but one in nine: tokens it would
    write, whitespace that follows a held-back token among them, cannot be drafted)."""
    t_space, d_space = spaces[target], spaces[draft]
    pair = pair_of(spaces, target, draft)
    target_model = TextModel(t_space, DOC, seed=3)
    wrong, split = {40, 41, 120}, {25, 60, 90, 150}
    draft_model = TextModel(d_space, DOC, seed=4, wrong=wrong, split=split)
    columns = np.flatnonzero(np.arange(d_space.size) % 9 != 4) if restricted else None
    if restricted:
        draft_model = with_columns(draft_model, columns)
    drafter = CrossVocabDrafter(draft_model, pair, t_space.size, method, columns=columns)
    prompt = t_space.head + t_space.encode(DOC[:PROMPT_BYTES])
    n = len(t_space.encode(DOC[PROMPT_BYTES:])) + 8  # past the end of the text: noise, drafts rejected
    plain = greedy(Engine(target_model.sequence(), None, gamma=0), prompt, n)
    assert bytes(b"".join(t_space.text[t] for t in plain))[: len(DOC) - PROMPT_BYTES] == DOC[PROMPT_BYTES:]
    result = Engine(target_model.sequence(), drafter, gamma=4).generate(
        prompt, SamplingParams(), max_new_tokens=n, eos_token_ids=[]
    )
    assert result.token_ids == plain
    assert result.stats.acceptance_rate > (0.15 if restricted else 0.25), result.stats.by_drafter


# ---- sampled output: toy vocabularies, the joint distribution by enumeration --------------------------------------

# The target spells a, b, ab, c; the draft b, a, ba, c, x, abc: they share a, b and c (TLI drafts only those), the
# target's "ab" ends inside the draft's "abc" and the draft's "ba" straddles two target tokens.
TOY_TARGET = [b"a", b"b", b"ab", b"c"]
TOY_DRAFT = [b"b", b"a", b"ba", b"c", b"x", b"abc"]
# Whitespace the two split differently: the draft writes a newline and the indentation after it as one token, and a
# colon and the newline after it, the target each as two, so that the draft's "\n" or ":" ending the context is
# held back and its first token drawn among "\n  " or ":\n" (their rests "  " and "\n" mapped to the target's).
TOY_TARGET_SPACES = [b"x", b":", b"\n", b"  "]
TOY_DRAFT_SPACES = [b":", b"\n", b"\n  ", b"x", b" ", b":\n"]


def toy_pair(target=TOY_TARGET, draft=TOY_DRAFT) -> VocabularyPair:
    return VocabularyPair(TokenSpace(target), TokenSpace(draft), len(target), len(draft))


def toy_target(pieces=TOY_TARGET) -> ToyModel:
    """The target: its next token's logits depend on its last token only."""
    return ToyModel.random(len(pieces), periods=1, seed=11)


def toy_draft(target=TOY_TARGET, draft=TOY_DRAFT) -> ToyModel:
    """A draft near the target: after a draft token, the target's logits after the target token its text ends
    like (a little off), over the draft's tokens of the same text (its own tokens given logits of their own), so
    that TLI's drafts are accepted about half the time."""
    table = toy_target(target).table[0]  # [target, target]
    log_p = table - np.log(np.exp(table).sum(axis=1, keepdims=True))  # log p(next | last target token)
    noise = np.random.Generator(np.random.Philox(12)).standard_normal((len(draft), len(draft)))
    out = np.zeros((1, len(draft), len(draft)), dtype=np.float32)
    for d, text in enumerate(draft):
        ends = [t for t, piece in enumerate(target) if text.endswith(piece)]
        last = max(ends, key=lambda t: len(target[t])) if ends else 0
        for j, piece in enumerate(draft):  # log p of the target's tokens spelling the draft token's text
            spelled, at, prev = 0.0, 0, last
            while at < len(piece):
                t = max(
                    (t for t in range(len(target)) if piece.startswith(target[t], at)),
                    default=None,
                    key=lambda t: len(target[t]),
                )
                if t is None:
                    spelled = log_p[last].min() - 1.0
                    break
                spelled += log_p[prev, t]
                at, prev = at + len(target[t]), t
            out[0, d, j] = spelled
        out[0, d] += 0.5 * noise[d]
    return ToyModel(out)


def toy_drafter(method: str, target=TOY_TARGET, draft=TOY_DRAFT, columns=None) -> CrossVocabDrafter:
    model = toy_draft(target, draft)
    if columns is not None:
        model = with_columns(model, np.asarray(columns))
    return CrossVocabDrafter(model, toy_pair(target, draft), len(target), method, columns=columns)


def with_columns(model: Model, columns: np.ndarray) -> Model:
    """``model`` with its logits restricted to ``columns`` (draft ids), as ``restrict_output`` restricts a quantized
    model's output layer (its sequences too)."""

    class Restricted(type(model)):
        def forward(self, tokens, num_logits=None):
            return super().forward(tokens, num_logits)[:, columns]

        def sequence(self):
            return with_columns(super().sequence(), columns)

    model.__class__ = Restricted
    return model


def sampled_counts(engine: Engine, params: SamplingParams, n: int, length: int = 3) -> dict:
    counts: dict = {}
    for i in range(n):
        run = SamplingParams(params.temperature, params.top_k, params.top_p, params.min_p, seed=5000 + i)
        ids = tuple(engine.generate([1], run, max_new_tokens=length, eos_token_ids=[]).token_ids)
        counts[ids] = counts.get(ids, 0) + 1
    return counts


SPACES = (TOY_TARGET_SPACES, TOY_DRAFT_SPACES)


@pytest.mark.parametrize(
    ("method", "params", "gamma", "vocabularies", "columns"),
    [
        ("tli", SamplingParams(temperature=1.0, top_p=0.9), 3, (), None),
        ("tli", SamplingParams(temperature=0.7, top_p=0.8), 2, (), None),
        ("tli", SamplingParams(temperature=1.0, top_k=3, min_p=0.05), 4, (), None),
        ("tli", SamplingParams(temperature=0.7, top_p=0.9), 3, SPACES, None),
        ("tli", SamplingParams(temperature=1.0), 2, SPACES, None),
        ("slem", SamplingParams(temperature=0.7, top_p=0.9), 3, (), None),
        ("tli", SamplingParams(temperature=1.0, top_p=0.9), 3, (), [0, 1, 2, 5]),  # no "c": drafts a and b only
        ("tli", SamplingParams(temperature=0.7, top_p=0.9), 3, SPACES, [0, 1, 3, 5]),  # no "\n  "
    ],
)
def test_sampled_output_follows_the_targets_distribution(method, params, gamma, vocabularies, columns):
    """The first three emitted tokens follow the target's joint distribution (chi-square against enumeration), on
    letters and on whitespace (where TLI's first token is drawn among the draft's longer tokens), with the draft
    model's output restricted to some of its tokens too (a draft vocabulary)."""
    target = toy_target(*vocabularies[:1])
    engine = Engine(target, toy_drafter(method, *vocabularies, columns=columns), gamma=gamma)
    n = 5000
    counts = sampled_counts(engine, params, n)
    long_run = Engine(target, toy_drafter(method, *vocabularies, columns=columns), gamma=gamma)
    stats = long_run.generate([1], params, 200, eos_token_ids=[]).stats
    low = 0.1 if method == "tli" else 0.05  # SLEM's greedy drafts under sampling: accepted with p(x) only
    assert low < stats.acceptance_rate < 0.95, stats.by_drafter  # accepted and rejected drafts both
    pvalue = chi2_pvalue(counts, exact_joint(target, [1], params, 3), n)
    assert pvalue > 1e-4, f"emitted sequences do not follow p (chi-square p-value {pvalue:.2e})"


def test_tli_q_is_a_distribution_over_the_targets_ids_on_shared_tokens_only():
    drafter = toy_drafter("tli")
    draft = drafter.propose([0, 1], 3, SamplingParams(temperature=1.0, top_p=0.9), make_generator(0))
    assert draft.probs.shape == (len(draft), len(TOY_TARGET))
    assert np.allclose(draft.probs.sum(axis=1), 1.0)
    assert np.all(draft.probs[:, 2] == 0)  # "ab": the target's only
    for token, q in zip(draft.ids, draft.probs):
        assert q[token] > 0  # each token drawn from its q
    greedy_draft = drafter.propose([0, 1], 3, SamplingParams(), None)
    assert greedy_draft.probs is None and all(t in (0, 1, 3) for t in greedy_draft.ids)


# ---- the tokenizer boundaries, one by one -------------------------------------------------------------------------


def synced(drafter: CrossVocabDrafter, context: list[int]) -> list[int]:
    """Sync the drafter to ``context``; check that its cache spells the context's text and holds what it fed."""
    drafter._sync(context)
    assert bytes(drafter._fs) == bytes(drafter._cs)
    assert drafter.model.tokens == drafter._fed
    return list(drafter._fed)


def test_a_target_token_ending_inside_a_draft_token_is_retokenized_when_the_text_completes_it():
    drafter = toy_drafter("tli")
    a, b, c = 0, 1, 3  # the target's ids
    assert synced(drafter, [a]) == [1]  # "a"
    assert synced(drafter, [a, b]) == [1, 0]  # "a", "b": no draft token "ab"
    feeds = drafter.model.feeds
    assert synced(drafter, [a, b, c]) == [5]  # "abc": one draft token over three target tokens
    assert drafter.model.feeds == feeds + 1  # rolled back and fed once
    assert synced(drafter, [2, c]) == [5]  # the target's "ab", then "c": the same text, nothing fed
    assert drafter.model.feeds == feeds + 1


def test_real_vocabularies_a_target_token_ending_inside_a_draft_token(spaces):
    """Qwen2.5's "Ġcoö" + "perate" style splits: for words the two tokenizers cut differently, each prefix of the
    target's tokens leaves the draft's cache spelling exactly that text, and the whole word ends as the draft's
    tokenizer tokenizes it."""
    pair = pair_of(spaces, "qwen", "smol")
    t, d = spaces["qwen"], spaces["smol"]
    drafter = CrossVocabDrafter(TextModel(d, b""), pair, t.size, "tli")
    words = [" internationalization", " coöperate", " Unbelievably", " 東京タワー", " ...!!!", "    return"]
    cut = 0
    for word in words:
        ids = t.encode(b"x =" + word.encode())
        for i in range(1, len(ids) + 1):
            synced(drafter, ids[:i])
        assert drafter._fed == d.encode(b"x =" + word.encode())
        cut += len(ids) > 1 and len(d.encode(word.encode())) != len(t.encode(word.encode()))
    assert cut  # some word is cut differently by the two


@pytest.mark.parametrize("target", ["gemma", "qwen"])
def test_byte_tokens_of_one_character_become_the_drafts_character_once_whole(spaces, target):
    """A character the target writes as byte tokens (SentencePiece's <0xE2><0x82><0xAC>, or byte-level BPE's byte
    tokens): the draft sees its bytes while it is incomplete, then its own token of the whole character."""
    t, d = spaces[target], spaces["smol"]
    pair = pair_of(spaces, target, "smol")
    drafter = CrossVocabDrafter(TextModel(d, b""), pair, t.size, "tli")
    prefix = t.head + t.encode(b"costs 3")
    euro = "€".encode()
    byte_ids = [t.byte_ids[b] for b in euro]
    assert all(i is not None for i in byte_ids)
    context = list(prefix)
    for byte in byte_ids:
        context.append(byte)
        synced(drafter, context)
    assert drafter._fed == d.encode(b"costs 3" + euro)
    context += t.encode(b" ok")
    assert synced(drafter, context) == d.encode("costs 3€ ok".encode())


def test_markers_of_the_same_role_are_each_others_and_added_tokens_are_text(spaces, loaded):
    """ChatML's <|im_start|> / <|im_end|> (Qwen2.5, SmolLM2) and Gemma's <start_of_turn> / <end_of_turn> are shown
    to the draft as its own marker of the same role; Qwen2.5's user-defined <tool_call> is text; Gemma's draft gets
    its <bos> first."""
    qwen, smol, gemma = spaces["qwen"], spaces["smol"], spaces["gemma"]
    q_tok, s_tok, g_tok = (loaded[n].tokenizer for n in ("qwen", "smol", "gemma"))
    chat = "<|im_start|>user\nhi<tool_call><|im_end|>\n<|im_start|>assistant\n"
    drafter = CrossVocabDrafter(TextModel(smol, b""), pair_of(spaces, "qwen", "smol"), qwen.size, "tli")
    fed = synced(drafter, q_tok.encode(chat, add_special_tokens=False))
    im_start, im_end = s_tok.convert_tokens_to_ids("<|im_start|>"), s_tok.convert_tokens_to_ids("<|im_end|>")
    assert fed.count(im_start) == 2 and fed.count(im_end) == 1
    assert b"<tool_call>" in b"".join(smol.text[i] or b"" for i in fed)
    # Gemma's turn markers for SmolLM2's draft, and the other way round with Gemma's <bos> put first
    gemma_chat = "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
    drafter = CrossVocabDrafter(TextModel(smol, b""), pair_of(spaces, "gemma", "smol"), gemma.size, "tli")
    fed = synced(drafter, g_tok.encode(gemma_chat))
    assert fed[0] == im_start and fed.count(im_start) == 2 and fed.count(im_end) == 1
    assert fed == s_tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>model\n", add_special_tokens=False)
    drafter = CrossVocabDrafter(TextModel(gemma, b""), pair_of(spaces, "smol", "gemma"), smol.size, "tli")
    fed = synced(drafter, s_tok.encode(chat, add_special_tokens=False))
    bos, start = g_tok.convert_tokens_to_ids("<bos>"), g_tok.convert_tokens_to_ids("<start_of_turn>")
    assert fed[0] == bos and fed[1] == start and fed.count(start) == 2
    # TLI maps the draft's end-of-turn to the target's
    pair = pair_of(spaces, "gemma", "smol")
    mapped = dict(zip(pair.shared_draft.tolist(), pair.shared_target.tolist()))
    assert mapped[im_end] == g_tok.convert_tokens_to_ids("<end_of_turn>")


def test_a_marker_of_one_vocabulary_only_is_left_out_and_never_drafted(spaces, loaded):
    """Qwen2.5's <|object_ref_start|> and fill-in-the-middle markers have no counterpart in SmolLM2's vocabulary:
    the draft's text leaves them out, TLI cannot propose them, and SLEM stops where the draft writes a special
    token of its own (SmolLM2's <repo_name>) that the target lacks."""
    qwen, smol = spaces["qwen"], spaces["smol"]
    q_tok, s_tok = loaded["qwen"].tokenizer, loaded["smol"].tokenizer
    pair = pair_of(spaces, "qwen", "smol")
    only = [q_tok.convert_tokens_to_ids(m) for m in ("<|object_ref_start|>", "<|fim_pad|>", "<|repo_name|>")]
    assert not set(only) & set(pair.shared_target.tolist())
    drafter = CrossVocabDrafter(TextModel(smol, b""), pair, qwen.size, "tli")
    context = q_tok.encode("a", add_special_tokens=False) + only + q_tok.encode(" b", add_special_tokens=False)
    assert synced(drafter, context) == s_tok.encode("a b", add_special_tokens=False)

    class Writes(TextModel):  # always writes SmolLM2's <repo_name>
        def _row(self, n):
            row = np.zeros(self.vocab_size, dtype=np.float32)
            row[s_tok.convert_tokens_to_ids("<repo_name>")] = 10.0
            return row

    slem = CrossVocabDrafter(Writes(smol, b""), pair, qwen.size, "slem")
    assert len(slem.propose(q_tok.encode("hello", add_special_tokens=False), 4, SamplingParams(), None)) == 0
    tli = CrossVocabDrafter(Writes(smol, b""), pair, qwen.size, "tli")
    draft = tli.propose(q_tok.encode("hello", add_special_tokens=False), 4, SamplingParams(), None)
    assert len(draft) == 4 and not set(draft.ids) & set(only)


def test_rejected_draft_tokens_are_rolled_back():
    drafter = toy_drafter("tli")
    context = [0, 1, 3]  # "abc"
    draft = drafter.propose(context, 3, SamplingParams(), None)
    assert len(drafter._fed) == 1 + 2  # "abc" and the first two drafted tokens (the last is not fed)
    # the target rejected the first drafted token and wrote its own
    other = next(t for t in (0, 1, 3) if t != draft.ids[0])
    synced(drafter, context + [other])
    assert bytes(drafter._fs) == b"abc" + TOY_TARGET[other]
    # all accepted, plus a bonus token: the last drafted token is fed now
    drafted = drafter.propose(context, 3, SamplingParams(), None).ids
    synced(drafter, context + drafted + [3])
    assert bytes(drafter._fs) == b"abc" + b"".join(TOY_TARGET[t] for t in drafted) + b"c"


def test_slem_tokenizes_the_drafts_text_with_the_targets_tokenizer_across_the_boundary(spaces):
    """The draft continues a word: its text is tokenized by the target's tokenizer together with the context's last
    tokens, which are dropped from the result where they come out as in the context ("Ġinternational" + "ization"
    from the whole); where the whole is cut otherwise ("Ġinter" is no token of "Ġinternationalization"), the draft's
    text is tokenized alone, after the context's tokens as they are."""
    t, d = spaces["qwen"], spaces["smol"]
    pair = pair_of(spaces, "qwen", "smol")
    doc = b"x = internationalization(value)"
    for cut in (b"x = international", b"x = inter"):
        prefix, rest = t.encode(cut), doc[len(cut) :]
        drafter = CrossVocabDrafter(TextModel(d, doc), pair, t.size, "slem")
        draft = drafter.propose(prefix, 8, SamplingParams(), None)
        whole = t.encode(doc)
        want = whole[len(prefix) :] if whole[: len(prefix)] == prefix else t.encode(rest)
        assert (whole[: len(prefix)] == prefix) == (cut == b"x = international")
        assert draft.ids[: len(want)] == want  # (the draft model writes on past the text's end: noise)
        assert b"".join(t.text[i] for i in want) == rest


class SureModel(TextModel):
    """A TextModel without noise, sure of the text's next token (margin 12) except after ``weak`` bytes of it
    (margin 0.1: about a third over three tokens)."""

    def __init__(self, space: TokenSpace, doc: bytes, weak=()):
        super().__init__(space, doc)
        self.noise[:] = 0.0
        self.weak = set(weak)

    def sequence(self) -> SureModel:
        return SureModel(self.space, self.doc, self.weak)

    def _row(self, n: int) -> np.ndarray:
        row = self.noise.copy()
        favoured = self._favoured(self.spelled[n])
        if favoured is not None:
            row[favoured] += 0.1 if len(self.spelled[n]) in self.weak else self.margin
        return row


# The target spells "ab" as one token, which nothing longer begins with, and "a", which "ab" begins with; the draft
# writes a letter a token.
GROW_TARGET = [b"a", b"b", b"c", b"ab"]
GROW_DRAFT = [b"a", b"b", b"c"]


def grow_drafter(doc: bytes, weak=(), lookahead: float = 0.5) -> CrossVocabDrafter:
    pair = VocabularyPair(TokenSpace(GROW_TARGET), TokenSpace(GROW_DRAFT), len(GROW_TARGET), len(GROW_DRAFT))
    model = SureModel(TokenSpace(GROW_DRAFT), doc, weak)
    return CrossVocabDrafter(model, pair, len(GROW_TARGET), "slem", lookahead)


def test_a_target_token_grows_where_a_longer_one_begins_with_it(spaces):
    pair = VocabularyPair(TokenSpace(GROW_TARGET), TokenSpace(GROW_DRAFT), len(GROW_TARGET), len(GROW_DRAFT))
    assert [pair.grows(t) for t in range(len(GROW_TARGET))] == [True, False, False, False]
    assert not pair.grows(-1) and not pair.grows(len(GROW_TARGET))
    qwen = pair_of(spaces, "qwen", "smol")
    t = spaces["qwen"].by_bytes
    assert qwen.grows(t[b";\n"]) and qwen.grows(t[b"):"]) and qwen.grows(t[b"i"])  # ";\n\n", "):\n", "iostream"
    assert not qwen.grows(t[b"0"])  # digits are single tokens
    end = next(i for i, c in spaces["qwen"].special.items() if c == "<|im_end|>")
    assert not qwen.grows(end)  # a marker


def test_slem_needs_no_more_text_after_a_last_token_nothing_longer_begins_with():
    """Asked for k tokens, SLEM writes until the k-th is known whole: the start of one more, or, where no longer
    target token begins with the k-th, the k-th itself (one draft pass fewer)."""
    c, a, b = 2, 0, 1  # the draft's ids
    for k, want, fed in [
        (1, [3], [c, a]),  # "ab": whole without the "c" after it ("b" is not fed)
        (2, [3, 2], [c, a, b]),  # "ab", "c"
        (3, [3, 2, 3], [c, a, b, c, a]),  # "ab", "c", "ab"
    ]:
        drafter = grow_drafter(b"cabcabcab")
        draft = drafter.propose([2], k, SamplingParams(), None)
        assert draft.ids == want and drafter._fed == fed, k
    drafter = grow_drafter(b"cabcabcab")
    assert drafter.propose([2, 3, 2, 0], 1, SamplingParams(), None).ids == [1]  # "b" after "a": a token of its own
    assert drafter._fed == [c, a, b, c, a]  # (the context's "a" + "b" would be "ab": SLEM drafts "b" as the text)


@pytest.mark.parametrize(
    ("doc", "want"),
    [
        (b"cabcab", [3, 2]),  # "ab", "c": "c" ends where the draft stopped, and nothing longer begins with it
        (b"cababc", [3]),  # "ab", "a": "a" may be the start of "ab", left out
    ],
)
def test_slem_stopping_on_confidence_proposes_a_last_token_only_where_it_is_whole(doc, want):
    drafter = grow_drafter(doc, weak={3}, lookahead=1.0)  # unsure of the draft's third token
    draft = drafter.propose([2], 4, SamplingParams(), None, stop=0.5)
    assert draft.ids == want


# ---- `model:PATH` ---------------------------------------------------------------------------------------------------


def test_a_draft_model_of_another_vocabulary_drafts_across_it(files, loaded):
    target = loaded["qwen"]
    [drafter] = make_drafter(f"model:{files['smol']}", target)
    assert isinstance(drafter, CrossVocabDrafter) and drafter.method == "auto"
    assert 0.6 < drafter.pair.overlap < 0.95
    [tli] = make_drafter(f"model:{files['gemma']}?method=tli", target)
    assert tli.method == "tli" and tli.name == "model-tli"
    [same] = make_drafter(f"model:{files['qwen']}?method=slem", target)  # forced on one vocabulary: allowed
    assert isinstance(same, CrossVocabDrafter) and same.pair.overlap > 0.99
    with pytest.raises(ValueError, match="method=tli, method=slem or method=auto"):
        make_drafter(f"model:{files['smol']}?method=bogus", target)
    with pytest.raises(ValueError, match="lookup= is for a draft model of the target's vocabulary"):
        make_drafter(f"model:{files['smol']}?lookup=4", target)
    [narrow] = make_drafter(f"model:{files['smol']}?vocab=1000", target)  # its output layer: 1,000 rows (+ its eos)
    assert 1000 <= narrow._columns.size <= 1002 and narrow.model.vocab_size == narrow._columns.size
    ids = target.tokenizer.encode("def f(x):", add_special_tokens=False)
    plain = greedy(Engine(target.model, None, gamma=0), ids, 24)
    assert greedy(Engine(target.model, narrow, gamma=3), ids, 24) == plain
    with pytest.raises(ValueError, match="give 1 to 49152 \\(the tokens of the model's output layer\\)"):
        make_drafter(f"model:{files['smol']}?vocab=60000", target)  # the draft's own vocabulary bounds it
    for spec in (f"ngram+model:{files['smol']}", f"model:{files['gemma']}?method=tli"):
        assert greedy(Engine(target.model, make_drafter(spec, target), gamma=3), ids, 24) == plain


def test_fork_gives_each_sequence_its_own_cache():
    drafter = toy_drafter("tli")
    drafter.propose([0, 1, 3], 3, SamplingParams(), None)
    other = drafter.fork(None)
    assert other._fed == [] and other.model is not drafter.model and other.pair is drafter.pair
    assert (
        other.propose([0, 1, 3], 3, SamplingParams(), None).ids
        == toy_drafter("tli").propose([0, 1, 3], 3, SamplingParams(), None).ids
    )


def test_auto_drafts_by_slem_and_tli_only_when_asked():
    drafter = toy_drafter("auto")
    greedy_draft = drafter.propose([0, 1, 3], 3, SamplingParams(), None)
    assert drafter.name == "model-slem" and greedy_draft.probs is None
    sampled = drafter.propose([0, 1, 3], 3, SamplingParams(temperature=0.8), make_generator(1))
    assert drafter.name == "model-slem" and sampled.probs is None  # verified by the coupled rule
    tli = toy_drafter("tli")
    assert tli.propose([0, 1, 3], 3, SamplingParams(temperature=0.8), make_generator(1)).probs is not None
    assert tli.name == "model-tli"


def test_tli_draws_its_first_token_among_the_drafts_longer_tokens_after_held_back_whitespace():
    """The context ends with the target's "\n": the draft's "\n" is held back, and where the draft model prefers a
    longer token beginning with it ("\n  "), TLI proposes the target's token of the rest ("  ") with q over the
    rests; the cache then holds the longer token."""
    drafter = toy_drafter("tli", TOY_TARGET_SPACES, TOY_DRAFT_SPACES)
    pair = drafter.pair
    assert [a.tolist() for a in pair.healed(1)] == [[2], [3]]  # after the draft's "\n": "\n  ", its rest "  "
    assert [a.tolist() for a in pair.healed(0)] == [[5], [2]]  # after ":": ":\n", its rest "\n"
    table = drafter.model.table
    table[0, :, :] = -5.0
    table[0, :, 2] = 5.0  # the draft model always writes "\n  "
    draft = drafter.propose([0, 2], 2, SamplingParams(temperature=1.0), make_generator(0))  # "x\n"
    assert draft.ids[0] == 3 and draft.probs[0, 3] == 1.0  # "  ", the one rest there is
    assert drafter._fed[:2] == [3, 2]  # "x", then "\n  " in place of the held "\n"
    table[0, :, 5] = 4.0  # and ":\n" over ":"
    assert drafter.propose([0, 1], 1, SamplingParams(), None).ids == [2]  # "x:": ":\n", its rest "\n"
    drafter = toy_drafter("tli", TOY_TARGET_SPACES, TOY_DRAFT_SPACES)
    drafter.model.table[0, :, :] = -5.0
    drafter.model.table[0, :, 5] = -6.0  # ":" over ":\n": the held ":" is fed, then a shared token drafted
    assert len(drafter.propose([0, 1], 1, SamplingParams(), None)) == 1
    assert drafter._fed == [3, 0]


def test_sequences_of_a_batch_each_draft_across_vocabularies(files, loaded):
    """The batch engine forks the drafter per sequence: each keeps its own cache of its own text, and greedy output
    equals each request decoded alone."""
    from specwise.batch import BatchEngine
    from specwise.step import Request

    target = loaded["qwen"]
    tok = target.tokenizer
    texts = ["def f(x):", "Hello, world", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "x = [1, 2"]
    prompts = [tok.encode(t, add_special_tokens=False) for t in texts]
    requests = [Request(p, SamplingParams(), 10 + 2 * i, eos_token_ids=[]) for i, p in enumerate(prompts)]
    drafters = make_drafter(f"ngram+model:{files['gemma']}", target)
    engine = Engine(target.model, drafters, gamma=3)
    events = BatchEngine(engine, max_batch=4).run_all(requests)
    got = [[t for e in evs for t in e.token_ids] for evs in events]
    plain = Engine(target.model.sequence(), None, gamma=0)
    want = [plain.generate(r.prompt_ids, r.params, r.max_new_tokens, eos_token_ids=[]).token_ids for r in requests]
    assert got == want


# ---- `auto`: the default model across vocabularies where it pays ----------------------------------------------------


def test_the_overlap_and_pass_bytes_are_read_from_the_files_headers(files):
    from specwise.drafters.cross_vocab.choice import file_overlap, pass_bytes
    from specwise.models.gguf_file import GGUFFile

    smol, qwen, gemma = (GGUFFile(files[n]) for n in ("smol", "qwen", "gemma"))
    assert 0.7 < file_overlap(smol, qwen) < 0.9 and 0.9 < file_overlap(smol, gemma) < 0.98  # 80% and 94%
    assert file_overlap(qwen, qwen) == 1.0
    # a pass reads the output layer and the layers; the untied embedding only a row a token
    assert pass_bytes(qwen) == sum(t.nbytes for n, t in qwen.tensors.items() if n != "token_embd.weight")


def test_auto_drafts_across_vocabularies_for_a_target_large_enough(files, loaded, tmp_path, monkeypatch):
    """`auto` adds the default model (here a tiny one of SmolLM2's vocabulary) across vocabularies for a target whose
    pass reads at least 1 / DRAFT_SHARE times its bytes, not for a smaller one, nor where too little of the
    vocabulary is shared; greedy output equals plain decoding."""
    import specwise.drafters.cross_vocab.choice as choice
    import specwise.files
    from specwise.drafters import resolve_drafter_spec
    from specwise.models import load_model

    monkeypatch.setattr(choice, "AUTO_DRAFT", str(files["smol"]))
    monkeypatch.setattr(specwise.files, "gguf_dir", lambda cache=None: tmp_path / "empty")
    (tmp_path / "big").mkdir()
    big = load_model(str(tiny_vocab_gguf(tmp_path / "big" / "tiny-qwen-wide.gguf", hidden=96)))
    spec = resolve_drafter_spec("auto", big)
    assert spec == f"ngram+model:{files['smol']}"
    for small in ("qwen", "gemma"):  # a pass of 3.3 and 5.4 times the draft's bytes
        assert resolve_drafter_spec("auto", loaded[small]) == "ngram"
    monkeypatch.setattr(choice, "MIN_OVERLAP", 0.9)  # SmolLM2 shares 80% of its vocabulary with Qwen2.5
    assert resolve_drafter_spec("auto", big) == "ngram"
    monkeypatch.setattr(choice, "MIN_OVERLAP", 0.5)
    drafters = make_drafter("auto", big)
    assert [type(d).__name__ for d in drafters] == ["NgramDrafter", "CrossVocabDrafter"]
    ids = big.tokenizer.encode("def mean(values):\n    return", add_special_tokens=False)
    plain = greedy(Engine(big.model, None, gamma=0), ids, 24)
    assert greedy(Engine(big.model, drafters, gamma="auto"), ids, 24) == plain


# ---- `specwise profile` and `specwise bench`: the overlap and each method's acceptance ------------------------------


def test_profile_reports_the_overlap_and_each_methods_cost_and_acceptance(files, tmp_path, monkeypatch, capsys):
    import json

    from specwise.cli import main

    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path / "cache"))
    args = ["profile", "--target", str(files["qwen"]), "--drafter", f"model:{files['smol']}"]
    assert main([*args, "--max-k", "2", "--repeats", "1", "--context", "16", "--json"]) == 0
    cross = json.loads(capsys.readouterr().out)["cross_vocabulary"]
    assert cross["method"] == "auto" and cross["draft_tokens"] == 49152 and cross["target_tokens"] >= 151643
    assert 0.7 < cross["overlap"] < 0.9 and cross["shared_tokens"] == pytest.approx(cross["overlap"] * 49152, 0.02)
    assert set(cross["methods"]) == {"tli", "slem"}
    for m in cross["methods"].values():
        assert m["seconds_per_token"] > 0 and m["relative_cost"] > 0 and m["drafted"] > 0
        assert 0 <= m["acceptance_rate"] <= 1 and m["mean_accepted_length"] >= 1
    assert cross["probe"]["greedy"] and cross["probe"]["prompts"] == 2
    assert main([*args, "--max-k", "2", "--repeats", "1", "--context", "16"]) == 0
    printed = capsys.readouterr().out
    assert "of the draft's 49,152 tokens are the target's" in printed and "  tli: " in printed and "  slem: " in printed
    assert main(["profile", "--target", str(files["qwen"]), "--drafter", "ngram", "--max-k", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cross_vocabulary"] is None


def test_bench_reports_the_overlap_and_each_methods_acceptance(files, loaded):
    from specwise.lab.bench.prompts import default_prompts, select_prompts
    from specwise.lab.bench.report import render_markdown
    from specwise.lab.bench.runner import BenchSettings, run_bench, validate_results

    smol = files["smol"]
    drafters = [f"model:{smol}?method=tli", f"model:{smol}?method=slem", f"ngram+model:{smol}", "ngram"]
    settings = BenchSettings(drafters=drafters, gammas=[3], max_new_tokens=12, hf_baselines=False, warmup=False)
    data = run_bench(settings, select_prompts(default_prompts(), ["coding"], 1), loaded=loaded["qwen"], progress=False)
    validate_results(data)
    cross = {c["drafter"]: c["cross_vocabulary"] for c in data["configurations"]}
    assert cross["none"] is None and cross["ngram"] is None
    assert cross[drafters[0]]["method"] == "tli" and cross[drafters[1]]["method"] == "slem"
    assert 0.7 < cross[drafters[2]]["overlap"] < 0.9
    summary = {(s["config"], s["category"]): s for s in data["summary"]}
    by = {c["drafter"]: summary[(c["id"], "all")]["acceptance_by_drafter"] for c in data["configurations"]}
    assert by["none"] is None and set(by[drafters[0]]) == {"model-tli"} and set(by[drafters[1]]) == {"model-slem"}
    tli = by[drafters[0]]["model-tli"]
    assert tli["drafted"] > 0 and tli["acceptance_rate"] == tli["accepted"] / tli["drafted"]
    assert all(r["identical_to_plain"] for r in data["runs"] if r["identical_to_plain"] is not None)
    text = render_markdown(data)
    assert "## Acceptance by drafter (all categories)" in text and "| model-slem |" in text
    assert f"{cross[drafters[0]]['overlap']:.1%}" in text
