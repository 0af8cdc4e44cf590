"""Speculative decoding statistics, defined once and reported the same way everywhere.

alpha (acceptance rate) = accepted / drafted.
tau (mean accepted length) = tokens emitted per target pass (accepted + 1 per step, less any cut at EOS or
    the token budget).
expected tau: the i.i.d. theory, (1 - alpha^(k+1)) / (1 - alpha) for a step that drafts k tokens, averaged
    over the steps actually taken (so steps without a draft count as 1).
accepted / rejected prediction tokens (OpenAI's names): tokens of a request's predicted output that were drafted
    and accepted by the target / drafted and rejected (a draft's tokens after its first rejected one count as
    rejected: the target did not keep them). A prediction token drafted in two steps counts in both; one never
    drafted (the answer went another way) counts in neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PREDICTION", "SpecStats", "expected_tau"]

PREDICTION = "prediction"  # the name of a request's predicted-output source in ``by_drafter``


def expected_tau(alpha: float, gamma: int) -> float:
    """E[tokens per target pass] when each of gamma drafts is accepted independently with probability alpha."""
    if gamma <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


@dataclass
class SpecStats:
    """Counters and timings of one generation (or, merged, of many)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # leading prompt tokens whose cache a previous request left (prompt caching): not fed
    new_tokens: int = 0
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    # tokens a grammar forced (jump-forward): fed and emitted in a step's pass without being drafted; counted in
    # new_tokens, never in drafted or accepted
    forced: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    gamma_histogram: dict[int, int] = field(default_factory=dict)
    # why steps drafted nothing: budget | schedule | calibrate | no_draft | low_confidence
    plain_step_reasons: dict[str, int] = field(default_factory=dict)
    # per drafter (the parts of a combined one, e.g. ngram and head): steps that verified its draft, tokens drafted
    # and accepted
    by_drafter: dict[str, dict[str, int]] = field(default_factory=dict)
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    total_seconds: float = 0.0

    def record_step(self, drafted: int, accepted: int, emitted: int, drafter: str | None = None) -> None:
        """One target pass that verified ``drafted`` tokens (proposed by ``drafter``), kept ``accepted`` and
        emitted ``emitted``."""
        if drafter is not None and drafted > 0:
            self._add_drafter(drafter, {"steps": 1, "drafted": drafted, "accepted": accepted})
        self.target_passes += 1
        self.drafted += drafted
        self.accepted += accepted
        self.new_tokens += emitted
        self.gamma_histogram[drafted] = self.gamma_histogram.get(drafted, 0) + 1
        grow = drafted - len(self.drafted_by_position)
        if grow > 0:
            self.drafted_by_position.extend([0] * grow)
            self.accepted_by_position.extend([0] * grow)
        for i in range(drafted):
            self.drafted_by_position[i] += 1
            if i < accepted:
                self.accepted_by_position[i] += 1

    def _add_drafter(self, name: str, counts: dict[str, int]) -> None:
        entry = self.by_drafter.setdefault(name, {"steps": 0, "drafted": 0, "accepted": 0})
        for key, value in counts.items():
            entry[key] = entry.get(key, 0) + value

    @property
    def accepted_prediction_tokens(self) -> int:
        """Tokens of the request's prediction drafted and accepted by the target."""
        return self.by_drafter.get(PREDICTION, {}).get("accepted", 0)

    @property
    def rejected_prediction_tokens(self) -> int:
        """Tokens of the request's prediction drafted and rejected by the target."""
        counts = self.by_drafter.get(PREDICTION, {})
        return counts.get("drafted", 0) - counts.get("accepted", 0)

    @property
    def acceptance_rate(self) -> float:
        """alpha: accepted / drafted (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """tau: tokens emitted per target pass."""
        return self.new_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """Fraction of the steps that drafted position i in which position i was accepted."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position)]

    @property
    def expected_mean_accepted_length(self) -> float:
        """Theoretical tau for the measured alpha and the numbers of tokens actually drafted per step."""
        if not self.target_passes:
            return 0.0
        alpha = self.acceptance_rate
        total = sum(count * expected_tau(alpha, k) for k, count in self.gamma_histogram.items())
        return total / self.target_passes

    @property
    def tokens_per_second(self) -> float:
        """New tokens per second of wall time, prefill included."""
        return self.new_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    def merge(self, other: SpecStats) -> SpecStats:
        """Add another run's counters and times into this one; returns self."""
        for name in ("prompt_tokens", "cached_tokens", "new_tokens", "target_passes", "drafted", "accepted", "forced"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("prefill_seconds", "draft_seconds", "verify_seconds", "total_seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for k, count in other.gamma_histogram.items():
            self.gamma_histogram[k] = self.gamma_histogram.get(k, 0) + count
        for reason, count in other.plain_step_reasons.items():
            self.plain_step_reasons[reason] = self.plain_step_reasons.get(reason, 0) + count
        for name, counts in other.by_drafter.items():
            self._add_drafter(name, counts)
        grow = len(other.drafted_by_position) - len(self.drafted_by_position)
        if grow > 0:
            self.drafted_by_position.extend([0] * grow)
            self.accepted_by_position.extend([0] * grow)
        for i, (d, a) in enumerate(zip(other.drafted_by_position, other.accepted_by_position)):
            self.drafted_by_position[i] += d
            self.accepted_by_position[i] += a
        return self

    def to_dict(self) -> dict:
        """The JSON form used by the CLI, the server and the benchmark."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "new_tokens": self.new_tokens,
            "target_passes": self.target_passes,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "forced": self.forced,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "expected_mean_accepted_length": self.expected_mean_accepted_length,
            "acceptance_by_position": self.acceptance_by_position,
            "drafted_by_position": list(self.drafted_by_position),
            "accepted_by_position": list(self.accepted_by_position),
            "gamma_histogram": {str(k): v for k, v in sorted(self.gamma_histogram.items())},
            "plain_step_reasons": dict(sorted(self.plain_step_reasons.items())),
            "by_drafter": {name: dict(counts) for name, counts in sorted(self.by_drafter.items())},
            "tokens_per_second": self.tokens_per_second,
            "prefill_seconds": self.prefill_seconds,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "total_seconds": self.total_seconds,
        }

    def summary(self) -> str:
        """A few human-readable lines."""
        by_pos = " ".join(f"{x:.2f}" for x in self.acceptance_by_position) or "-"
        extra = []
        if len(self.by_drafter) > 1:
            parts = ", ".join(
                f"{name} {c['steps']} steps, {c['accepted']}/{c['drafted']} accepted"
                for name, c in sorted(self.by_drafter.items())
            )
            extra.append(f"by drafter: {parts}")
        return "\n".join(
            [
                f"tokens: {self.new_tokens} new ({self.prompt_tokens} prompt) in {self.total_seconds:.2f} s "
                f"= {self.tokens_per_second:.1f} tokens/s",
                f"target passes: {self.target_passes}   drafted: {self.drafted}   accepted: {self.accepted}   "
                f"alpha: {self.acceptance_rate:.3f}",
                f"tau (tokens/pass): {self.mean_accepted_length:.2f}   "
                f"theory: {self.expected_mean_accepted_length:.2f}",
                f"acceptance by position: {by_pos}",
                f"time: prefill {self.prefill_seconds:.2f} s, draft {self.draft_seconds:.2f} s, "
                f"verify {self.verify_seconds:.2f} s",
                *extra,
            ]
        )
