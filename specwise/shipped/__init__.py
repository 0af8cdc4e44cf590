"""Data shipped with specwise: trained heads (heads/) and suffix indexes (indexes/) for the default model, draft
vocabulary rankings (vocabs/), and the default instruction prompts of ``distill`` and ``index`` (prompts/)."""
