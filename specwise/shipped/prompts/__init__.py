"""Instruction prompts shipped with specwise: the default prompts of ``specwise distill`` and ``specwise index``
(a public subset; sources and licences in README.md)."""
