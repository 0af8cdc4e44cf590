"""Draft vocabulary rankings shipped with specwise, one per tokenizer (named by its fingerprint; see README.md)."""
