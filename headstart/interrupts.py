"""Long commands (train, distill) stop on SIGTERM as on Ctrl-C: a scheduler's preemption,
`timeout` or `kill` then keeps the work done (a checkpoint, the finished records) instead of
losing it to the default handler, which ends the process at once."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


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
