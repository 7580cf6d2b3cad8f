"""SIGTERM as Ctrl-C (distillation) and the training loop's stop at a step's end."""

from __future__ import annotations

import os
import signal
import time

import pytest


def test_sigterm_is_a_ctrl_c_inside_the_block_and_the_handler_comes_back():
    from headstart.interrupts import stop_signals_interrupt

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), stop_signals_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
    assert signal.getsignal(signal.SIGTERM) is before


def test_signals_stop_at_the_step_end_once_armed_and_the_handlers_come_back():
    """Before the loop runs (start-up) a signal interrupts at once; while it runs, the first
    SIGTERM or Ctrl-C only asks it to stop after its step, a second interrupts at once; after,
    the old handlers are back."""
    from headstart.interrupts import stop_at_step_end

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), stop_at_step_end():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
    with stop_at_step_end() as stop:
        stop.armed = True
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)  # the handler runs between two bytecodes of this thread
        assert stop.requested and stop.signal == "SIGINT"
        # a launcher forwards a terminal's Ctrl-C to its workers as SIGTERM too: the same request
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert stop.signal == "SIGINT"
        stop.at -= 5  # later: a second request, at once
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
