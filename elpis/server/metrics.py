"""Counters for `/metrics`, written in the Prometheus text format (version 0.0.4)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ROUND_BUCKETS = tuple(range(1, 17))  # tokens committed per round: 1..16 (a round commits at most 16)


class Metrics:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()  # (endpoint, status) -> count
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.prefix_cache_hits = 0  # requests that reused at least one cached token
        self.prefix_cache_lookups = 0
        self.rounds = 0
        self.round_histogram: Counter[int] = Counter()  # committed tokens -> rounds
        self.cancelled = 0

    def request_done(self, endpoint: str, status: int) -> None:
        self.requests[(endpoint, status)] += 1

    def generation_done(
        self,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int,
        committed_per_round: Iterable[int],
    ) -> None:
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.cached_tokens += cached_tokens
        self.prefix_cache_lookups += 1
        self.prefix_cache_hits += cached_tokens > 0
        for committed in committed_per_round:
            self.rounds += 1
            self.round_histogram[committed] += 1

    def render(self, *, queue_depth: int, running: int, healthy: bool) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: Callable[[], Iterable[str]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(samples())

        metric(
            "elpis_requests_total",
            "counter",
            "HTTP requests answered, by endpoint and status.",
            lambda: (
                f'elpis_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                for (e, s), n in sorted(self.requests.items())
            ),
        )
        for name, value, help_text in (
            ("elpis_prompt_tokens_total", self.prompt_tokens, "Prompt tokens of finished generations."),
            ("elpis_completion_tokens_total", self.completion_tokens, "Generated tokens."),
            (
                "elpis_prefix_cache_tokens_total",
                self.cached_tokens,
                "Prompt tokens served from the prefix cache.",
            ),
            (
                "elpis_prefix_cache_hits_total",
                self.prefix_cache_hits,
                "Generations that reused a cached prefix.",
            ),
            (
                "elpis_prefix_cache_lookups_total",
                self.prefix_cache_lookups,
                "Generations that looked up the cache.",
            ),
            ("elpis_cancelled_total", self.cancelled, "Requests cancelled because the client went away."),
        ):
            metric(name, "counter", help_text, lambda value=value, name=name: [f"{name} {value}"])

        def histogram() -> list[str]:
            out, running_total, token_sum = [], 0, 0
            for bucket in ROUND_BUCKETS:
                running_total += self.round_histogram.get(bucket, 0)
                out.append(f'elpis_tokens_per_round_bucket{{le="{bucket}"}} {running_total}')
            out.append(f'elpis_tokens_per_round_bucket{{le="+Inf"}} {self.rounds}')
            token_sum = sum(k * n for k, n in self.round_histogram.items())
            out.append(f"elpis_tokens_per_round_sum {token_sum}")
            out.append(f"elpis_tokens_per_round_count {self.rounds}")
            return out

        metric("elpis_tokens_per_round", "histogram", "Tokens committed per verify round.", histogram)
        metric(
            "elpis_queue_depth",
            "gauge",
            "Requests waiting for the engine.",
            lambda: [f"elpis_queue_depth {queue_depth}"],
        )
        metric(
            "elpis_running",
            "gauge",
            "Requests running on the engine (0 or 1).",
            lambda: [f"elpis_running {running}"],
        )
        metric(
            "elpis_healthy",
            "gauge",
            "1 when the engine can take requests.",
            lambda: [f"elpis_healthy {int(healthy)}"],
        )
        return "\n".join(lines) + "\n"
