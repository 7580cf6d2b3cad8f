"""The server's decode loop: it runs in the MAIN thread (PyTorch's forward is ~1.5x slower in
another thread on this CPU: 57 against 35-39 ms for an 8-row step of SmolLM2, measured), owns the
target and every engine; HTTP handlers (uvicorn's thread) hand it jobs and read their tokens back
through an asyncio queue.

Requests with the same warping (greedy, or one temperature/top-p/top-k) share one continuous
engine (headstart.inference.engine): a newcomer is prefilled and joins the running batch between
two steps, a finished or abandoned row leaves at once. Engines with live rows take turns, one
step each. Limits: at most `max_batch` rows a lane (newcomers wait for a row to leave) and
`max_queue` requests waiting in all (then `submit` refuses: the caller answers 429). A request's
choices (several prompts, n) are submitted together and join the same wave. Work a ticket asks
for after its reply (the logprobs' scoring forward) runs here too, between two steps: the target
is never run by two threads at once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from headstart.inference.engine import Engine, Job
from headstart.inference.plain import SamplingConfig
from headstart.inference.prefix import SharedPrefix

log = logging.getLogger("headstart.serve")


KEPT_DECODERS = 4
"""Compiled decoders a server keeps, one per sampling setting seen lately (each holds its graphs'
KV buffers: rows x capacity x layers)."""


class QueueFull(Exception):
    """Too many requests waiting: answer 429."""


class Closing(Exception):
    """The server is shutting down: answer 503."""

    def __init__(self, message: str = "the server is shutting down") -> None:
        super().__init__(message)


@dataclass
class Ticket:
    """One choice of a request between its handler (asyncio) and the worker thread. The choices
    of one request (n, several prompts) share one `events` queue; each event names its `index`."""

    job: Job
    warp: tuple[float, float, int]  # (temperature, top_p, top_k): the lane
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    index: int = 0
    after: Callable[[Job], Any] | None = None
    """Run in the worker thread when the job has finished (its result is posted as "scored"
    before "done"): work on the target that must not race the decode loop (logprobs.py)."""
    queued_s: float = field(default_factory=time.perf_counter)

    def post(self, kind: str, value: Any) -> None:
        """From the worker thread: an event for the handler ("tokens", "scored", "done",
        "error"). Once the HTTP server has stopped, its event loop is closed and nobody is left
        to tell."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (self.index, kind, value))
        except RuntimeError:  # "Event loop is closed"
            pass

    @property
    def decodes(self) -> bool:
        """False for pure scoring (max_tokens 0 with echo): no engine row, only `after`."""
        return self.job.rule.max_new_tokens > 0


class Scheduler:
    def __init__(self, make_decoder: Any, metrics: Any, max_batch: int = 8, max_queue: int = 64,
                 speculate_up_to: int | None = None, prefix_cache: int = 8, recorder: Any = None,
                 batch_buckets: tuple[int, ...] = ()) -> None:  # fmt: skip
        self.make_decoder = (
            make_decoder  # (greedy: bool) -> SpeculativeDecoder (one per lane: its own generators)
        )
        self.speculate_up_to = speculate_up_to  # Engine's: past it, steps are plain
        # Prompts opening with the same >= this many tokens (the chat template's system turn) reuse
        # one prefill of them, kept across lanes and waves (inference/prefix.py)
        self.prefix_cache = prefix_cache
        self.prefix: SharedPrefix | None = None
        self.metrics = metrics
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.waiting: deque[Ticket] = deque()
        self.lanes: dict[tuple[float, float, int], Engine] = {}
        self.tickets: dict[int, Ticket] = {}  # id(job) -> its ticket, while in a lane
        self.wake = threading.Condition()
        self.closing = False
        self.recorder = recorder  # serve --record (serve/record.py): finished replies, kept for training
        # --compile: each lane's batch padded to these sizes (inference/engine.py, ghosts), and its
        # decoder kept for the lane's next wave (its compiled graphs and buffers); () eager
        self.batch_buckets = batch_buckets
        self.decoders: dict[tuple[float, float, int], Any] = {}  # at most KEPT_DECODERS, newest last

    # ---- handlers' side -----------------------------------------------------------------------
    def submit(self, *tickets: Ticket) -> None:
        """Queue a request's choices together (all or none), so that they join one wave."""
        with self.wake:
            if self.closing:
                raise Closing
            if len(self.waiting) + len(tickets) > self.max_queue:
                raise QueueFull
            self.waiting.extend(tickets)
            self.metrics.queue_depth = len(self.waiting)
            self.wake.notify()

    def close(self) -> None:
        """Accept nothing more (SIGTERM): new requests get 503. Requests already accepted, running
        or waiting, go on (a streaming client may already hold its first chunk); `cancel_running`
        ends them when the grace period is over."""
        with self.wake:
            self.closing = True
            self.wake.notify()

    def cancel_running(self) -> None:
        """The grace period is over: waiting requests fail (503), running ones are answered 503 (an
        error event when streamed) and their rows leave at the next step."""
        with self.wake:
            for ticket in self.waiting:
                ticket.post(
                    "error", Closing("the server shut down before this request started (--grace ran out)")
                )
            self.waiting.clear()
            self.metrics.queue_depth = 0
            for ticket in list(self.tickets.values()):
                if not ticket.job.cancelled:
                    ticket.job.cancelled = True
                    ticket.post(
                        "error",
                        Closing("the server shut down before this request finished (--grace ran out)"),
                    )
            self.wake.notify()

    # ---- the loop (main thread) ---------------------------------------------------------------
    def run(self, until: Any) -> None:
        """Decode until `until()` is true and nothing runs (the HTTP server has stopped). `until`
        is asked between every two steps, busy or idle: it also ends the grace period."""
        while True:
            finished = until()
            with self.wake:
                if not self.waiting and not self._live():
                    if finished:
                        return
                    self.wake.wait(0.1)  # a timeout: `until` (and signals) are checked while idle
                    continue
                admit = self._admissible()
            self._admit(admit)
            for warp, engine in list(self.lanes.items()):
                try:
                    plain, forwards = engine.plain_steps, engine.target_forwards
                    self._finish(engine.step())  # (an engine whose rows all left steps as a no-op)
                    self.metrics.stepped(engine.target_forwards - forwards, engine.plain_steps - plain)
                except Exception as err:  # noqa: BLE001 - a bug must fail its requests, not the server
                    log.exception("decode step failed: %s", err)
                    self._fail_lane(warp, err)
                    continue
                if not engine.live:
                    del self.lanes[warp]  # one lane per sampling setting seen: never kept idle

    def _live(self) -> bool:
        return any(engine.live for engine in self.lanes.values())

    def _admissible(self) -> list[Ticket]:
        """Waiting tickets that fit in their lane now, in arrival order (under the lock)."""
        taken, room = [], {key: self.max_batch - e.live for key, e in self.lanes.items()}
        for ticket in list(self.waiting):
            if ticket.job.cancelled:  # the client left while it waited
                self.waiting.remove(ticket)
                ticket.post("done", "cancelled")
                continue
            free = room.get(ticket.warp, self.max_batch)
            if not ticket.decodes:  # scoring takes no row
                taken.append(ticket)
                self.waiting.remove(ticket)
            elif free > 0:
                room[ticket.warp] = free - 1
                taken.append(ticket)
                self.waiting.remove(ticket)
        self.metrics.queue_depth = len(self.waiting)
        return taken

    def _admit(self, tickets: list[Ticket]) -> None:
        by_lane: dict[tuple[float, float, int], list[Ticket]] = {}
        for ticket in tickets:
            if ticket.decodes:
                by_lane.setdefault(ticket.warp, []).append(ticket)
            else:
                self.metrics.observe_wait(time.perf_counter() - ticket.queued_s)
                ticket.job.finish = "length"
                self._conclude(ticket)
        for warp, group in by_lane.items():
            engine = self.lanes.get(warp)
            if engine is None or not engine.live:  # a fresh engine per wave: state starts small
                temperature, top_p, top_k = warp
                sampling = SamplingConfig(max_new_tokens=1, temperature=temperature, top_p=top_p, top_k=top_k)
                # A sampled lane never switches between speculative and plain steps as rows come
                # and go: the two draw their random numbers differently, and a seeded request
                # must give the same text whatever else runs beside it. cost: sampled rows
                # speculate at every batch size (on a CPU, slower than plain steps past one row).
                limit = self.speculate_up_to if temperature == 0 else None
                decoder = self._decoder(warp)
                if self.prefix is None and self.prefix_cache:  # every lane's decoder has the same heads
                    self.prefix = SharedPrefix(
                        decoder.target, self.prefix_cache, layers=decoder.feature_layers
                    )
                engine = Engine(decoder, sampling, row_seeds=temperature > 0, speculate_up_to=limit,
                                prefix=self.prefix, abortable=True, batch_buckets=self.batch_buckets)  # fmt: skip
                self.lanes[warp] = engine
            for ticket in group:
                self.tickets[id(ticket.job)] = ticket
                self.metrics.observe_wait(time.perf_counter() - ticket.queued_s)
            self.metrics.running += len(group)
            try:
                reused = engine.prefix_reused
                self._finish(engine.add([t.job for t in group]))
                self.metrics.prefix_cached += engine.prefix_reused - reused
            except Exception as err:  # noqa: BLE001 - a bug must fail its requests, not the server
                log.exception("admitting requests failed: %s", err)
                self._fail_lane(warp, err)

    def _decoder(self, warp: tuple[float, float, int]) -> Any:
        """A decoder for a new engine of this sampling setting: a fresh one when eager (state
        starts small), the setting's kept one when compiled (a fresh decoder would compile its
        graphs again), the least recently used of KEPT_DECODERS dropped past it."""
        if not self.batch_buckets:
            return self.make_decoder(warp[0] == 0)
        decoder = self.decoders.pop(warp, None) or self.make_decoder(warp[0] == 0)
        self.decoders[warp] = decoder
        while len(self.decoders) > KEPT_DECODERS:
            del self.decoders[next(iter(self.decoders))]
        return decoder

    def _finish(self, jobs: list[Job]) -> None:
        # --record: a step's finished replies on disk, one sync, before their clients hear
        if self.recorder is not None:
            done = [(job, self.tickets[id(job)]) for job in jobs if id(job) in self.tickets]
            self.recorder.add_many([(job.prompt, job.emitted, job.finish, ticket.warp) for job, ticket in done
                                    if ticket.decodes and job.finish in ("stop", "length")])  # fmt: skip
        for job in jobs:
            ticket = self.tickets.pop(id(job), None)
            if ticket is not None:
                self.metrics.finished(job)
                self.metrics.running -= 1
                self._conclude(ticket)

    def _conclude(self, ticket: Ticket) -> None:
        """Run the ticket's `after` (unless its client left), then tell it that it is done."""
        if ticket.after is not None and ticket.job.finish != "cancelled":
            try:
                ticket.post("scored", ticket.after(ticket.job))
            except Exception as err:  # noqa: BLE001 - its request fails, not the lane beside it
                log.exception("scoring failed: %s", err)
                ticket.post("error", err)
                return
        ticket.post("done", ticket.job.finish)

    def _fail_lane(self, warp: tuple[float, float, int], err: Exception) -> None:
        """After an unexpected error a lane's state is unknown: fail its requests (the other
        lanes' go on) and drop it; its next request starts a fresh one."""
        for key, ticket in list(self.tickets.items()):
            if ticket.warp == warp:
                ticket.post("error", err)
                del self.tickets[key]
                self.metrics.running -= 1
        self.lanes.pop(warp, None)
