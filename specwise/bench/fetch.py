"""``python -m specwise.bench.fetch``: the former path of ``python -m specwise.lab.bench.fetch`` (fetching benchmark
GGUF files), kept for the commands written with it."""

from specwise.lab.bench.fetch import main

if __name__ == "__main__":
    raise SystemExit(main())
