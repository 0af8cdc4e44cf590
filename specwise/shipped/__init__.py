"""Data shipped with specwise: trained heads (heads/) and suffix indexes (indexes/) for the default model, and draft
vocabulary rankings (vocabs/)."""
