"""`headstart serve`'s lifecycle: uvicorn in a side thread, the decode loop in the main thread
(which owns the signals), SIGTERM or Ctrl-C stopping admissions and giving running requests
--grace seconds before the loop answers what is left with a 503 (an error event when streamed)."""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import threading
import time
from typing import Any

from headstart.errors import HeadstartError

log = logging.getLogger("headstart.serve")


def thread_server_class() -> type:
    import uvicorn

    class ThreadServer(uvicorn.Server):
        """uvicorn's server in a side thread: the main thread decodes and owns the signals."""

        @contextlib.contextmanager
        def capture_signals(self):  # noqa: ANN202 - uvicorn's signature
            yield  # the main thread's handlers set should_exit (see serve_until_stopped)

    return ThreadServer


def serve_until_stopped(app: Any, scheduler: Any, host: str, port: int, grace: float, started: str,
                        header_timeout: float = 10.0) -> int:  # fmt: skip
    """Serve `app` on host:port and run `scheduler`'s decode loop until a signal and the grace
    period end it; `started` is logged once the port listens; a request's headers get
    `header_timeout` seconds (serve/headers.py). Returns the exit status (0)."""
    import uvicorn

    from headstart.serve.headers import header_timeout_protocol

    # uvicorn's own cut (it cancels handlers: a bare 500, streams without [DONE]) comes after the
    # decode loop's, which answers what still runs at --grace with a 503 or an error event. The
    # margin is wide: on a loaded 2-core host the loop's answer came 3 to over 6 s after --grace
    # (2026-11-27; not understood yet), and uvicorn's cut at +5 s then turned every 503 into a 500
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", http=header_timeout_protocol(header_timeout),
                            timeout_graceful_shutdown=math.ceil(grace) + 30, access_log=False)  # fmt: skip
    server = thread_server_class()(config)
    http = threading.Thread(target=server.run, name="headstart-http", daemon=True)
    stopping: dict[str, float] = {}

    def stop(signum: int, frame: object) -> None:  # SIGTERM / Ctrl-C: stop admitting, let runs finish
        if "at" not in stopping:
            stopping["at"] = time.monotonic()
            scheduler.close()
            server.should_exit = True  # uvicorn waits up to --grace for open requests, then ends
        else:
            server.force_exit = True

    before = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    http.start()
    deadline = time.monotonic() + 30
    while not server.started and http.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not server.started:
        server.should_exit = True
        http.join(5)
        raise HeadstartError(f"cannot listen on {host}:{port}", "choose another --port or --host")
    log.info("%s on http://%s:%d/v1", started, host, port)

    def over() -> bool:
        if "at" in stopping and time.monotonic() - stopping["at"] > grace:
            scheduler.cancel_running()
        return not http.is_alive()

    try:
        scheduler.run(over)  # the decode loop, in the main thread, until the HTTP server has stopped
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        scheduler.close()
        scheduler.cancel_running()
    log.info("stopped")
    return 0


def check_listen(host: str, port: int) -> None:
    """--host is an address of this machine and --port free there: one line now, not a traceback
    from uvicorn after the target has loaded. The probe socket is closed at once (port 0: any)."""
    import errno
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]  # fmt: skip
    except (socket.gaierror, UnicodeError, ValueError) as err:
        raise HeadstartError(
            f"--host {host!r} is not an address this machine can listen on ({getattr(err, 'strerror', None) or err})",
            "use 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or one of its own addresses",
        ) from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # uvicorn sets it too
        try:
            probe.bind(address)
        except OSError as err:
            taken = err.errno == errno.EADDRINUSE
            raise HeadstartError(
                f"cannot listen on {host}:{port} ({err.strerror})",
                "choose another --port, or stop what listens there"
                if taken
                else "use 127.0.0.1, 0.0.0.0 or an address of this machine for --host",
            ) from None
