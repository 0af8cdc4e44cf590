"""Data shipped with specwise: trained heads (heads/) and suffix indexes (indexes/) for the default model."""
