"""headstart's messages go through the `logging` module ("headstart.*" loggers, to stderr), so one
switch sets how much every command says: `-q/--quiet` warnings and errors only and no progress bars
(tqdm reads TQDM_DISABLE), the default adds progress and information lines, `-v/--verbose` adds
debug lines and transformers' own info logs. Results (generated text, --json objects) go to stdout
and are never silenced."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

QUIET, NORMAL, VERBOSE = -1, 0, 1
_USER_ENV = {name: os.environ.get(name) for name in ("TQDM_DISABLE", "HEADSTART_VERBOSE")}


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (pytest's capture, a redirected stream)."""

    @property  # type: ignore[override]
    def stream(self):  # noqa: ANN201
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def configure(verbosity: int) -> None:
    level = {QUIET: logging.WARNING, NORMAL: logging.INFO, VERBOSE: logging.DEBUG}[verbosity]
    logger = logging.getLogger("headstart")
    logger.setLevel(level)
    if not any(getattr(h, "_headstart", False) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._headstart = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    # set, or put back as the user's environment had them, so a later command in the same process
    # (tests, notebooks) gets its own level
    for name, on in (("TQDM_DISABLE", verbosity == QUIET), ("HEADSTART_VERBOSE", verbosity == VERBOSE)):
        if on:
            os.environ[name] = "1"  # HEADSTART_VERBOSE: quiet_transformers() leaves transformers' logs on
        elif _USER_ENV[name] is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = _USER_ENV[name]


def progress_off() -> bool:
    """-q was given (or the user set TQDM_DISABLE): no progress bar at all. tqdm reads the variable
    only for bars made without an explicit `disable=`; those made with one must ask here."""
    return os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes")


@contextlib.contextmanager
def libraries_to_stderr() -> Iterator[None]:
    """What libraries print to stdout while this runs (deepspeed's import-time warning when
    transformers converts a GGUF, tracker banners) goes to stderr: stdout carries the command's
    results only (a --json object must parse). Python-level writes only, not a C library's."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def verbosity(quiet: bool, verbose: bool) -> int:
    return QUIET if quiet else VERBOSE if verbose else NORMAL


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' info logs and per-tensor progress bars while loading a target
    (left on with -v/--verbose)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if os.environ.get("HEADSTART_VERBOSE") == "1":
        yield
        return
    from transformers.utils import logging

    previous = logging.get_verbosity()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(previous)
        logging.enable_progress_bar()
