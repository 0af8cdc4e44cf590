"""Suffix indexes shipped with specwise: a target's own answers, for the `suffix` drafter (see docs/SUFFIX.md)."""
