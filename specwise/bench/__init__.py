"""The former home of the benchmarks, now :mod:`specwise.lab.bench`: only ``python -m specwise.bench.fetch`` is kept
here, for the commands written with it."""
