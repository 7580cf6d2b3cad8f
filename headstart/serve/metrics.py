"""`GET /metrics` in Prometheus' text format: requests by endpoint and status, tokens, tau
(tokens committed per target forward), the queue, and latency histograms. Written by hand: a
handful of series do not need a client library."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

MAX_FIELD_SERIES = 64  # distinct ignored-field names counted by name; later ones count as "(other)"
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Histogram:
    def __init__(self) -> None:
        self.counts = [0] * len(BUCKETS)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.total += 1
        self.sum += value
        for i, edge in enumerate(BUCKETS):
            if value <= edge:
                self.counts[i] += 1

    def lines(self, name: str) -> list[str]:
        out = [
            f'{name}_bucket{{le="{edge}"}} {count}' for edge, count in zip(BUCKETS, self.counts, strict=True)
        ]
        return out + [f'{name}_bucket{{le="+Inf"}} {self.total}', f"{name}_sum {self.sum:.6f}",
                      f"{name}_count {self.total}"]  # fmt: skip


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: Counter = Counter()  # (endpoint, status) -> count
        self.ignored_fields: Counter = Counter()  # unknown request field -> requests that sent it
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.row_steps = 0  # verify forwards summed over rows
        self.committed = 0  # tokens they committed
        self.prefix_cached = 0  # prompt tokens taken from the prefix cache instead of prefilled
        self.steps = Counter()  # decode steps by kind: speculative (a tree verified) or plain
        self.queue_depth = 0
        self.running = 0
        self.latency = Histogram()  # request seconds, arrival to last token
        self.first_token = Histogram()  # seconds to the first token
        self.queue_wait = Histogram()

    def request(self, endpoint: str, status: int) -> None:
        with self.lock:
            self.requests[(endpoint, status)] += 1

    def ignored(self, names: list[str]) -> None:
        """Fields a request sent that headstart ignored. The names come from clients: a bounded
        number of series, and label values escaped as Prometheus' text format asks."""
        with self.lock:
            for name in set(names):
                known = name in self.ignored_fields or len(self.ignored_fields) < MAX_FIELD_SERIES
                self.ignored_fields[name if known else "(other)"] += 1

    def stepped(self, steps: int, plain: int) -> None:
        """A lane's decode step(s): `plain` of the `steps` decoded without a tree (past
        --speculate-up-to, where a verify of every row's tree costs more than it saves)."""
        with self.lock:
            self.steps["plain"] += plain
            self.steps["speculative"] += steps - plain

    def observe_wait(self, seconds: float) -> None:
        with self.lock:
            self.queue_wait.observe(seconds)

    def finished(self, job: Any) -> None:
        with self.lock:
            self.row_steps += job.steps
            self.committed += job.committed

    def served(self, prompt: int, completion: int, seconds: float, first: float | None) -> None:
        with self.lock:
            self.prompt_tokens += prompt
            self.generation_tokens += completion
            self.latency.observe(seconds)
            if first is not None:
                self.first_token.observe(first)

    def text(self) -> str:
        with self.lock:
            tau = self.committed / self.row_steps if self.row_steps else 0.0
            lines = ["# TYPE headstart_requests_total counter"]
            lines += [f'headstart_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                      for (e, s), n in sorted(self.requests.items())]  # fmt: skip
            lines += [
                "# HELP headstart_ignored_fields_total requests that sent a field headstart ignores, by field",
                "# TYPE headstart_ignored_fields_total counter",
            ]
            lines += [f'headstart_ignored_fields_total{{field="{_label(f)}"}} {n}'
                      for f, n in sorted(self.ignored_fields.items())]  # fmt: skip
            lines += [
                "# TYPE headstart_prompt_tokens_total counter", f"headstart_prompt_tokens_total {self.prompt_tokens}",
                "# TYPE headstart_generation_tokens_total counter",
                f"headstart_generation_tokens_total {self.generation_tokens}",
                "# HELP headstart_prefix_cached_tokens_total prompt tokens copied from the prefix cache, not prefilled",
                "# TYPE headstart_prefix_cached_tokens_total counter",
                f"headstart_prefix_cached_tokens_total {self.prefix_cached}",
                "# HELP headstart_decode_steps_total decode steps, speculative (a tree verified) or plain",
                "# TYPE headstart_decode_steps_total counter",
                *(f'headstart_decode_steps_total{{kind="{kind}"}} {self.steps[kind]}' for kind in ("plain", "speculative")),
                "# HELP headstart_tau tokens committed per target forward, bonus token included",
                "# TYPE headstart_tau gauge", f"headstart_tau {tau:.4f}",
                "# TYPE headstart_queue_depth gauge", f"headstart_queue_depth {self.queue_depth}",
                "# TYPE headstart_running_requests gauge", f"headstart_running_requests {self.running}",
                "# TYPE headstart_request_seconds histogram", *self.latency.lines("headstart_request_seconds"),
                "# TYPE headstart_time_to_first_token_seconds histogram",
                *self.first_token.lines("headstart_time_to_first_token_seconds"),
                "# TYPE headstart_queue_wait_seconds histogram", *self.queue_wait.lines("headstart_queue_wait_seconds"),
            ]  # fmt: skip
        return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
