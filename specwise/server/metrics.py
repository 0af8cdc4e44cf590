"""Prometheus metrics of the server: requests, tokens, speculation (drafted, accepted, by position), batching
(sequences and rows per target pass), latencies.

Each app has its own registry, so several servers (or tests) in one process do not collide. The speculative
counters add up the same SpecStats the responses report in ``usage.speculative``.
"""

from __future__ import annotations

import threading

from specwise.extras import missing_extra
from specwise.metrics import SpecStats

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
except ModuleNotFoundError as err:
    raise missing_extra(err, "server", "specwise's server") from err

__all__ = ["CONTENT_TYPE_LATEST", "ServerMetrics"]

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


class ServerMetrics:
    """The server's metrics in their own registry; safe to update from any thread."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._totals = SpecStats()
        self._lock = threading.Lock()
        self._counters()
        self._gauges()
        self._histograms()

    def _counters(self) -> None:
        r = self.registry
        self.http_requests = Counter(
            "specwise_http_requests", "HTTP requests by route and status code", ["route", "status"], registry=r
        )
        self.requests = Counter(
            "specwise_requests",
            "Generation requests by endpoint and outcome (stop, length, cancelled, error)",
            ["endpoint", "outcome"],
            registry=r,
        )
        self.prompt_tokens = Counter("specwise_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.prompt_tokens_cached = Counter(
            "specwise_prompt_tokens_cached",
            "Prompt tokens whose cache a sequence kept from its previous request (a chat's earlier turns), not fed",
            registry=r,
        )
        self.prompt_tokens_copied = Counter(
            "specwise_prompt_tokens_copied",
            "Prompt tokens copied from another sequence's cache, not fed (a request's n choices share one prefill)",
            registry=r,
        )
        self.generation_tokens = Counter(
            "specwise_generation_tokens", "Tokens generated (including those of cancelled requests)", registry=r
        )
        self.target_passes = Counter("specwise_target_passes", "Target forward passes while decoding", registry=r)
        self.drafted = Counter("specwise_drafted_tokens", "Tokens drafted", registry=r)
        self.accepted = Counter("specwise_accepted_tokens", "Drafted tokens accepted by the target", registry=r)
        self.drafted_by_position = Counter(
            "specwise_drafted_tokens_by_position", "Steps that drafted position i (0-based)", ["position"], registry=r
        )
        self.accepted_by_position = Counter(
            "specwise_accepted_tokens_by_position", "Steps that accepted position i (0-based)", ["position"], registry=r
        )
        self.batch_passes = Counter(
            "specwise_batch_passes", "Target passes of the batch (each shared by its sequences)", registry=r
        )
        self.batch_step_seconds = Counter(
            "specwise_batch_step_seconds", "Time in batch steps: the target's pass and each sequence's work", registry=r
        )
        self.batch_pass_seconds = Counter(
            "specwise_batch_pass_seconds",
            "Time in the target's passes of the batch steps (one pass a step)",
            registry=r,
        )

    def _gauges(self) -> None:
        r = self.registry
        self.waiting = Gauge("specwise_requests_waiting", "Requests queued for the engine", registry=r)
        self.running = Gauge("specwise_requests_running", "Requests in the batch (being generated)", registry=r)
        self.sequences_running = Gauge(
            "specwise_batch_sequences_running", "Sequences holding a slot of the batch after the last step", registry=r
        )
        self.acceptance_rate = Gauge(
            "specwise_acceptance_rate", "alpha = accepted / drafted over all finished requests", registry=r
        )
        self.mean_accepted_length = Gauge(
            "specwise_mean_accepted_length", "tau = tokens per target pass over all finished requests", registry=r
        )
        self.acceptance_rate_by_position = Gauge(
            "specwise_acceptance_rate_by_position",
            "accepted / drafted at draft position i over all finished requests",
            ["position"],
            registry=r,
        )

    def _histograms(self) -> None:
        r = self.registry
        self.latency = Histogram(
            "specwise_request_latency_seconds",
            "Time from arrival to the last token of finished requests",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "specwise_queue_time_seconds", "Time requests waited for the engine", buckets=LATENCY_BUCKETS, registry=r
        )
        self.time_to_first_token = Histogram(
            "specwise_time_to_first_token_seconds",
            "Time from arrival to the first generated token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.time_per_output_token = Histogram(
            "specwise_time_per_output_token_seconds",
            "Mean time per token after the first, per finished request",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "specwise_batch_size",
            "Sequences per target pass (the batch size; a prompt being prefilled counts)",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_rows = Histogram(
            "specwise_batch_rows",
            "Rows (token positions) per target pass: last tokens, drafted tokens and prompt chunks",
            buckets=ROW_BUCKETS,
            registry=r,
        )

    def record_stats(self, stats: SpecStats) -> None:
        """Add a finished request's speculative statistics."""
        self.prompt_tokens_cached.inc(stats.cached_tokens)
        self.target_passes.inc(stats.target_passes)
        self.drafted.inc(stats.drafted)
        self.accepted.inc(stats.accepted)
        for i, (drafted, accepted) in enumerate(zip(stats.drafted_by_position, stats.accepted_by_position)):
            self.drafted_by_position.labels(str(i)).inc(drafted)
            self.accepted_by_position.labels(str(i)).inc(accepted)
        with self._lock:
            totals = self._totals.merge(stats)
            self.acceptance_rate.set(totals.acceptance_rate)
            self.mean_accepted_length.set(totals.mean_accepted_length)
            for i, rate in enumerate(totals.acceptance_by_position):
                self.acceptance_rate_by_position.labels(str(i)).set(rate)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)
