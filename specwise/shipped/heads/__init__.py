"""Trained head drafters shipped with specwise (one directory per target; see each README.md)."""
