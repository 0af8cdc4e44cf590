"""The token losses training offers (``specwise distill --loss``; :mod:`specwise.lab.distill.train` computes them)."""

LOSSES = ("kl", "tv", "jsd")
