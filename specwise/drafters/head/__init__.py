"""The `head` drafter: a small trained decoder layer on the target's own features (in the spirit of EAGLE).

- :mod:`~specwise.drafters.head.format`: the head directory (config, weights), the target's identity and checks;
- :mod:`~specwise.drafters.head.checks`: the checks of a head's files (untrusted input) before use;
- :mod:`~specwise.drafters.head.module`: the training module :class:`EagleHead` and :func:`new_head`;
- :mod:`~specwise.drafters.head.drafter`: :class:`HeadDrafter`, which drafts with a trained head.
"""

from specwise.drafters.head.drafter import HeadDrafter
from specwise.drafters.head.format import (
    HeadConfig,
    HeadFileError,
    HeadNotFoundError,
    TargetMismatchError,
    check_target,
    load_head,
    save_head,
    target_identity,
)
from specwise.drafters.head.module import EagleHead, new_head

__all__ = [
    "HeadConfig",
    "EagleHead",
    "HeadDrafter",
    "HeadFileError",
    "HeadNotFoundError",
    "TargetMismatchError",
    "check_target",
    "load_head",
    "new_head",
    "save_head",
    "target_identity",
]
