"""Long commands (train, distill) stop on SIGTERM as on Ctrl-C: a scheduler's preemption,
`timeout` or `kill` then keeps the work done (a checkpoint, the finished records) instead of
losing it to the default handler, which ends the process at once."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt inside the block, as Ctrl-C does. (SIGINT is Python's
    KeyboardInterrupt already, unless a shell started us in the background and left it ignored,
    on purpose.)"""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can only be set from the main thread
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


FORWARDED_S = 2.0
"""A signal this soon after the first is the same request (a launcher's forwarded copy), not a
second one."""


class StopRequest:
    """What the signal handlers of `stop_at_step_end` share with the training loop."""

    def __init__(self) -> None:
        self.armed = False  # False (start-up, the end): a signal interrupts at once
        self.signal: str | None = None  # the first signal's name, once one came while armed
        self.at = 0.0  # when it came

    @property
    def requested(self) -> bool:
        return self.signal is not None


@contextlib.contextmanager
def stop_at_step_end() -> Iterator[StopRequest]:
    """SIGINT (Ctrl-C) and SIGTERM, while the request is armed, ask the training loop to stop
    after the step it is in: it saves a checkpoint there and exits. Raising KeyboardInterrupt in the
    middle of a step instead would save a state from inside it (accelerate's micro-step counter
    advanced, or the weights updated while the step number was not), and `--resume` would then
    part from the uninterrupted run. A second signal, or one while not armed, raises
    KeyboardInterrupt at once (the checkpoints already written stay; the steps after them are lost)."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # handlers can only be set from the main thread
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.requested and time.monotonic() - stop.at < FORWARDED_S:
            return  # a launcher (torchrun, accelerate) forwards a terminal's Ctrl-C as SIGTERM too
        if not stop.armed or stop.requested:
            raise KeyboardInterrupt
        stop.signal, stop.at = signal.Signals(signum).name, time.monotonic()
        log.warning(
            f"{stop.signal}: stopping after this step, with a checkpoint (send it again, 2 s or more later, to "
            "stop at once, losing the steps since the last checkpoint)"
        )

    signals = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # ignored on purpose by a shell's `&`
        signals.append(signal.SIGINT)
    before = {number: signal.signal(number, handler) for number in signals}
    try:
        yield stop
    finally:
        for number, previous in before.items():
            signal.signal(number, previous)
