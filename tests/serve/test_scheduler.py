"""The server's decode loop without HTTP: lanes per sampling setting, the running gauge, a lane
that fails alone, and lanes that do not outlive their requests."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi")

from headstart.inference.decoder import SpeculativeDecoder  # noqa: E402
from headstart.inference.engine import Job  # noqa: E402
from headstart.inference.stops import StopRule  # noqa: E402
from headstart.serve.metrics import Metrics  # noqa: E402
from headstart.serve.scheduler import Scheduler, Ticket  # noqa: E402


@pytest.fixture(scope="module")
def target(tiny_llama):
    from headstart.target import load_target

    return load_target(str(tiny_llama))


def tickets(loop, temperatures):
    return [Ticket(Job(key=i, prompt=[5, 6, 7 + i], rule=StopRule(6), seed=i), (t, 1.0, 0), loop)
            for i, t in enumerate(temperatures)]  # fmt: skip


def events(loop, ticket):
    loop.run_until_complete(asyncio.sleep(0))  # deliver what the loop thread posted
    found = []
    while not ticket.events.empty():
        found.append(ticket.events.get_nowait())
    return found


def test_running_counts_admitted_rows_and_idle_lanes_go(target):
    loop = asyncio.new_event_loop()
    metrics = Metrics()
    scheduler = Scheduler(lambda: SpeculativeDecoder(target, None), metrics, max_batch=1)
    for ticket in tickets(loop, [0.0, 0.0, 0.5, 0.7]):
        scheduler.submit(ticket)
    scheduler._admit(scheduler._admissible())  # one row a lane: the second greedy request waits
    assert (metrics.running, metrics.queue_depth, len(scheduler.lanes)) == (3, 1, 3)
    scheduler.run(lambda: True)  # until idle
    assert (metrics.running, metrics.queue_depth) == (0, 0)
    assert not scheduler.lanes and not scheduler.tickets  # one lane per setting ever seen was kept
    loop.close()


def test_a_failing_step_fails_only_its_own_lane(target, monkeypatch):
    loop = asyncio.new_event_loop()
    metrics = Metrics()
    scheduler = Scheduler(lambda: SpeculativeDecoder(target, None), metrics, max_batch=4)
    greedy, sampled = tickets(loop, [0.0, 0.9])
    for ticket in (greedy, sampled):
        scheduler.submit(ticket)
    scheduler._admit(scheduler._admissible())
    broken = scheduler.lanes[sampled.warp]

    def fail() -> list:
        raise RuntimeError("probability tensor contains nan")

    monkeypatch.setattr(broken, "step", fail)
    scheduler.run(lambda: True)
    kinds = [kind for _, kind, _ in events(loop, sampled)]
    assert kinds[-1] == "error" and "done" not in kinds
    assert events(loop, greedy)[-1] == (0, "done", "length") and len(greedy.job.emitted) == 6
    assert metrics.running == 0
    loop.close()
