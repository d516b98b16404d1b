"""Prometheus metrics of the server (``GET /metrics``), in one registry per app."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8)


class Metrics:
    """Requests, errors, latency, tokens, sessions, batch sizes, exploration and cost terms, labelled by arm."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("polyturn_requests", "Requests served", ["arm", "endpoint"], registry=r)
        self.errors = Counter("polyturn_errors", "Requests answered with an error", ["arm", "endpoint", "status"],
                              registry=r)
        self.latency = Histogram("polyturn_request_latency_seconds", "Latency of an agent turn", ["arm", "endpoint"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("polyturn_queue_seconds", "Wait before a turn's first decode step", ["arm"],
                               buckets=LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("polyturn_tokens", "Tokens prefilled (prompt) and sampled (completion)",
                              ["arm", "kind"], registry=r)
        self.sessions = Gauge("polyturn_active_sessions", "Live sessions", ["arm"], registry=r)
        self.sessions_closed = Counter("polyturn_sessions_closed", "Sessions ended", ["arm", "reason"], registry=r)
        self.outcomes = Counter("polyturn_session_outcomes", "Session outcomes", ["arm", "outcome"], registry=r)
        self.share = Gauge("polyturn_arm_share", "Share of new sessions routed to the arm", ["arm"], registry=r)
        self.batch = Histogram("polyturn_decode_batch_rows", "Rows decoded together in a step", ["arm"],
                               buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.step = Histogram("polyturn_decode_step_seconds", "Seconds of one decode step (all its rows)", ["arm"],
                              buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0), registry=r)
        self.explored = Counter("polyturn_explorations", "Explored turns", ["arm", "result"], registry=r)
        self.costs = Counter("polyturn_costs", "Cost terms incurred by environment sessions' turns "
                             "(info['cost_terms'], e.g. cost/violation)", ["arm", "term"], registry=r)
        self.recorded = Counter("polyturn_recorded_sessions", "Sessions written as episode records", ["arm"],
                                registry=r)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
