"""The time budget's step estimate: start-up and the warm-up step must not make runs stop early."""

import pytest

from headstart.train import loop


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(loop, "clock", c)
    return c


def test_start_up_is_not_a_step(clock):
    budget = loop.Budget(100.0, started=clock())
    clock.now += 40.0  # loading the target and data
    budget.ready()
    clock.now += 2.0
    budget.stepped()
    assert budget.step_s == pytest.approx(2.0)


def test_the_warm_up_step_counts_only_until_a_second_is_timed(clock):
    budget = loop.Budget(100.0, started=clock())
    budget.ready()
    for took in (9.0, 1.0, 1.5, 1.2):  # the first step compiles and warms the allocator
        clock.now += took
        budget.stepped()
    assert budget.step_s == pytest.approx(1.5)  # the longest since the warm-up


def test_it_stops_before_a_step_and_its_save_would_pass_the_deadline(clock):
    budget = loop.Budget(10.0, started=clock())
    budget.ready()
    clock.now += 1.0
    budget.stepped()
    budget.timed("save", clock.now - 0.5)
    # a step (1.1 with its margin), two saves (1.0) and 1 s of slack: 3.1 s before the deadline
    clock.now = 1000.0 + 6.8
    assert not budget.exhausted(evaluates_next=False)
    clock.now = 1000.0 + 7.0
    assert budget.exhausted(evaluates_next=False)
    assert not loop.Budget(0.0, started=clock()).exhausted(True)  # no budget, never out of time
