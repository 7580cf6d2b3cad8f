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
from headstart.serve.scheduler import QueueFull, Scheduler, Ticket  # noqa: E402


@pytest.fixture(scope="module")
def target(tiny_llama):
    from headstart.targets import load_target

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
    scheduler = Scheduler(lambda greedy: SpeculativeDecoder(target, None), metrics, max_batch=1)
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
    scheduler = Scheduler(lambda greedy: SpeculativeDecoder(target, None), metrics, max_batch=4)
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


def test_a_requests_choices_join_one_wave_and_scoring_takes_no_row(target):
    """The choices of one request (batched prompts, n) are queued together and admitted in the
    same wave; a pure scoring ticket (max_tokens 0) runs its `after` without taking a row."""
    loop = asyncio.new_event_loop()
    scheduler = Scheduler(lambda greedy: SpeculativeDecoder(target, None), Metrics(), max_batch=4)
    shared = asyncio.Queue()
    choices = [Ticket(Job(key=i, prompt=[5, 6, 7 + i][: i + 1], rule=StopRule(6)), (0.0, 1.0, 0), loop, shared, index=i)
               for i in range(3)]  # fmt: skip
    scoring = Ticket(Job(key=9, prompt=[5, 6], rule=StopRule(0)), (0.0, 1.0, 0), loop, shared, index=3,
                     after=lambda job: ("scored", list(job.prompt)))  # fmt: skip
    scheduler.submit(*choices, scoring)
    scheduler._admit(scheduler._admissible())
    assert scheduler.lanes[(0.0, 1.0, 0)].live == 3 and not scheduler.waiting
    loop.run_until_complete(asyncio.sleep(0))
    assert [shared.get_nowait() for _ in range(2)] == [
        (3, "scored", ("scored", [5, 6])),
        (3, "done", "length"),
    ]
    with pytest.raises(QueueFull):  # all or none: a request larger than the room left is refused whole
        Scheduler(lambda greedy: None, Metrics(), max_queue=2).submit(*choices)
    loop.close()


def test_a_compiled_server_pads_its_lanes_and_keeps_their_decoders(target):
    """--compile: each lane's batch runs at a bucket size (ghost rows pad 3 requests to 4), its
    replies are the ones eager decoding gives, and the lane's decoder (its compiled graphs and
    buffers) serves its next wave; at most KEPT_DECODERS are kept."""
    from headstart.serve.scheduler import KEPT_DECODERS
    from headstart.serve.served import batch_buckets

    assert batch_buckets(8) == (1, 2, 4, 8) and batch_buckets(6) == (1, 2, 4, 8) and batch_buckets(1) == (1,)
    made = []

    def make(greedy):
        made.append(SpeculativeDecoder(target, None, compile=True, compile_backend="aot_eager"))
        return made[-1]

    loop = asyncio.new_event_loop()
    scheduler = Scheduler(make, Metrics(), max_batch=8, batch_buckets=batch_buckets(8))
    eager = Scheduler(lambda greedy: SpeculativeDecoder(target, None), Metrics(), max_batch=8)
    replies = []
    for sched in (scheduler, eager):
        wave = tickets(loop, [0.0, 0.0, 0.0])
        for ticket in wave:
            sched.submit(ticket)
        sched.run(lambda: True)
        replies.append([t.job.emitted for t in wave])
    assert replies[0] == replies[1] and all(len(r) == 6 for r in replies[0])
    assert len(made) == 1 and made[0].captured.steps > 0  # compiled steps ran, padded to 4 rows
    second = tickets(loop, [0.0])
    scheduler.submit(*second)
    scheduler.run(lambda: True)
    assert len(made) == 1 and second[0].job.emitted  # the greedy lane's next wave: the same decoder
    for temperature in (0.5, 0.6, 0.7, 0.8, 0.9):
        scheduler.submit(*tickets(loop, [temperature]))
        scheduler.run(lambda: True)
    assert len(scheduler.decoders) == KEPT_DECODERS and len(made) == 6
    loop.close()
