"""The lab: what measures and trains, apart from the runtime that decodes.

- :mod:`specwise.lab.bench`: ``specwise bench`` and ``simulate`` (paired runs against plain decoding and peers,
  reports, plots), the coding workloads, fetching benchmark GGUF files (``python -m specwise.lab.bench.fetch``);
- :mod:`specwise.lab.profile`: ``specwise profile`` (the cost curve c(k) and a drafter's cost on this machine);
- :mod:`specwise.lab.answers`: the target answering prompts, shared by ``distill`` and ``index``;
- :mod:`specwise.lab.distill`: ``specwise distill`` (training a head drafter);
- :mod:`specwise.lab.index`: ``specwise index`` (building a suffix index from the target's answers);
- :mod:`specwise.lab.ranking`: building a draft vocabulary's ranking (``python -m specwise.lab.ranking``).

The lab imports the runtime, not the other way round.
"""
