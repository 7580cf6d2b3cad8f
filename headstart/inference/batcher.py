"""The decoding engine behind a stream of requests (distillation's interface): requests in, replies
out through a callback, follow-up turns first."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from headstart.inference.decoder import SpeculativeDecoder
from headstart.inference.engine import Engine, Job
from headstart.inference.requests import EngineStats, Reply
from headstart.inference.stops import StopRule


class EngineBatcher:
    """The engine behind a stream of `requests.Request`s (distillation's interface): up to
    `max_batch` in flight, newcomers admitted in groups of about `prefill_tokens` padded prompt
    tokens (sorted by length, so a group pads little), follow-up turns first. With heads, the
    replies are drafted and verified like `generate`'s (greedy: exactly the target's)."""

    def __init__(self, target: Any, heads: Any = None, tree: Any = None, max_batch: int = 64,
                 admit_every: int = 8, prefill_tokens: int = 2048, shared_prefix: int = 8) -> None:  # fmt: skip
        self.target, self.heads, self.tree = target, heads, tree
        self.max_batch = max_batch
        self.admit_every = max(1, min(admit_every, max_batch))
        self.prefill_tokens = prefill_tokens
        self.shared_prefix = shared_prefix  # a prefix the prompts share runs once (inference/prefix.py)
        self.stats = EngineStats()
        self.make_decoder = lambda: SpeculativeDecoder(target, heads, tree=tree)

    @torch.no_grad()
    def run(self, requests: Any, on_reply: Callable[[Any, Any], Any], progress: Any = None) -> Any:
        from collections import deque

        source, queue = iter(requests), deque()
        # one engine per sampling setting (an engine's rows share their warping): greedy replies
        # and, in a self-conversation, the user turns the target samples, side by side
        lanes: dict[tuple[float, float, int], Engine] = {}
        asked: dict[int, Any] = {}  # id(job) -> its request

        def pull(count: int) -> None:
            while len(queue) < count and (nxt := next(source, None)) is not None:
                queue.append(nxt)

        def finished(jobs: list[Job]) -> None:
            for job in jobs:
                request = asked.pop(id(job))
                ended = job.finish == "stop"
                ids = job.emitted[:-1] if ended and job.emitted and job.emitted[-1] in job.rule.eos_token_ids \
                    else job.emitted  # fmt: skip
                self.stats.replies += 1
                self.stats.new_tokens += len(job.emitted)
                follow = on_reply(request, Reply(token_ids=ids, finished=ended))
                queue.extendleft(reversed(list(follow or [])))

        while True:
            live = sum(engine.live for engine in lanes.values())
            free = self.max_batch - live
            pull(free)
            if queue and free and (free >= self.admit_every or live == 0 or len(queue) < free):
                take = [queue.popleft() for _ in range(min(free, len(queue)))]
                start = time.perf_counter()
                for warp, group in _by_warp(take).items():
                    if warp not in lanes:
                        first = group[0].sampling
                        lanes[warp] = Engine(self.make_decoder(), first, row_seeds=not first.greedy,
                                             shared_prefix=self.shared_prefix, prefill_tokens=self.prefill_tokens)  # fmt: skip
                    jobs = [self._job(request) for request in group]
                    asked.update({id(job): request for job, request in zip(jobs, group, strict=True)})
                    self.stats.prompt_tokens += sum(len(r.prompt) for r in group)
                    finished(lanes[warp].add(jobs))  # grouped by length there
                self.stats.prefix_reused = sum(engine.prefix_reused for engine in lanes.values())
                self.stats.prefill_s += time.perf_counter() - start
            stepping = [engine for engine in lanes.values() if engine.live]
            if not stepping:
                pull(1)
                if not queue:
                    return self.stats
                continue
            for engine in stepping:
                start = time.perf_counter()
                self.stats.row_steps += engine.live
                finished(engine.step())
                self.stats.decode_steps += 1
                self.stats.decode_s += time.perf_counter() - start
            if progress is not None:
                progress(self.stats)

    def _job(self, request: Any) -> Job:
        rule = StopRule(request.sampling.max_new_tokens, frozenset(self.target.eos_token_ids))
        return Job(key=request.key, prompt=list(request.prompt), rule=rule, seed=request.seed)


def _by_warp(requests: list[Any]) -> dict[tuple[float, float, int], list[Any]]:
    """Requests by their sampling's warping (temperature, top-p, top-k), in arrival order."""
    lanes: dict[tuple[float, float, int], list[Any]] = {}
    for request in requests:
        sampling = request.sampling
        lanes.setdefault((sampling.temperature, sampling.top_p, sampling.top_k), []).append(request)
    return lanes
