"""The `suffix` drafter: the target's own earlier answers propose how the current one goes on.

Two kinds of index are searched for the longest suffix of the context (up to ``max_match`` tokens):

- a **global index** (:class:`SuffixIndex`) of answers the target wrote, built offline by ``specwise index``: a
  suffix array over the concatenated token ids, searched by bisection in native code (``kernels/suffix.c``);
- **counts** (:class:`NgramCounts`) kept as text arrives: the request's own prompt and output so far, and an
  optional overlay of recently served answers (:meth:`SuffixDrafter.add_answer`, bounded, in memory).

From a match, the draft follows the most frequent continuation, token by token, and each token's confidence is
``count(token | pattern) / (count(pattern) + smooth)``: in the global index the pattern grows with the draft (the
suffix array's range narrows); in the counts it is the last ``n`` tokens (an order-``n`` Markov chain, ``n`` the
match length). Among the sources' drafts the one with the most tokens expected to be accepted (the sum of the
running products of confidences) is proposed. Proposals are deterministic (``probs=None``), exact under the
rejection rule at any temperature.

The parts:

- :mod:`~specwise.drafters.suffix.index`: :class:`SuffixIndex` (build, search, save) and :func:`confidence`;
- :mod:`~specwise.drafters.suffix.load`: reading an index directory (untrusted input: every file checked first),
  the target an index was built for (the index shipped for a target: :func:`specwise.artifacts.shipped_index_dir`);
- :mod:`~specwise.drafters.suffix.drafter`: :class:`SuffixDrafter`, its counts kept as text arrives, and
  :func:`make_suffix_drafter` (the spec ``suffix[:DIR]``).
"""

from specwise.drafters.suffix.drafter import (
    LOCAL_ORDERS,
    AnswerOverlay,
    NgramCounts,
    SuffixDrafter,
    chained_accepted,
    make_suffix_drafter,
)
from specwise.drafters.suffix.index import (
    DEFAULT_PRIORS,
    DEPTH,
    FORMAT,
    FORMAT_VERSION,
    LEAD,
    REBUILD,
    SCAN,
    SEP,
    SUFFIX_ABI,
    IndexFileError,
    IndexNotFoundError,
    IndexTargetMismatchError,
    SuffixIndex,
    build_suffix_array,
    confidence,
)
from specwise.drafters.suffix.index import (
    _native as _native,  # the native search functions, bound on first use (tests check their bindings)
)
from specwise.drafters.suffix.load import (
    MAX_DEPTH,
    MAX_FINGERPRINT,
    MAX_META_BYTES,
    MAX_TOKENS,
    SPOT_PAIRS,
    SPOT_WIDTH,
    check_index_target,
    index_identity,
    load_index,
    read_array,
    read_index_info,
    refuse,
)

__all__ = [
    "DEFAULT_PRIORS",
    "DEPTH",
    "FORMAT",
    "FORMAT_VERSION",
    "LEAD",
    "LOCAL_ORDERS",
    "MAX_DEPTH",
    "MAX_FINGERPRINT",
    "MAX_META_BYTES",
    "MAX_TOKENS",
    "REBUILD",
    "SCAN",
    "SEP",
    "SPOT_PAIRS",
    "SPOT_WIDTH",
    "SUFFIX_ABI",
    "AnswerOverlay",
    "IndexFileError",
    "IndexNotFoundError",
    "IndexTargetMismatchError",
    "NgramCounts",
    "SuffixDrafter",
    "SuffixIndex",
    "build_suffix_array",
    "chained_accepted",
    "check_index_target",
    "confidence",
    "index_identity",
    "load_index",
    "make_suffix_drafter",
    "read_array",
    "read_index_info",
    "refuse",
]
