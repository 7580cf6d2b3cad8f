"""A deadline for a request's headers: uvicorn's h11 protocol times out an idle connection only
after a response (keep-alive), so a client that connects and sends part of its headers held the
connection (and a file descriptor) open as long as it liked; 14 s and more were measured
(2026-12-02; a slowloris client holds hundreds). Here a connection waiting for its request's
headers gets `timeout` seconds from its first byte of them (or from connecting): past it a 408 and
the connection closed. The body has its own deadline (serve/limits.py, --body-timeout)."""

from __future__ import annotations

from typing import Any


def header_timeout_protocol(timeout: float) -> type:
    """uvicorn's h11 protocol with a header deadline of `timeout` seconds (uvicorn.Config(http=...))."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeout(H11Protocol):
        header_timer: Any = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._follow()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._follow()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _waiting(self) -> bool:
            """Headers not complete yet, with some of them read (an idle keep-alive connection is
            uvicorn's own timer's)."""
            return self.conn.their_state is h11.IDLE and not self.transport.is_closing()

        def _follow(self) -> None:
            if not self._waiting():
                self._disarm()
            elif self.header_timer is None and self.conn.trailing_data[0]:
                self._arm()

        def _arm(self) -> None:
            self._disarm()
            self.header_timer = self.loop.call_later(timeout, self._late)

        def _disarm(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

        def _late(self) -> None:
            self.header_timer = None
            if not self._waiting():
                return
            body = f"the request headers did not arrive within {timeout:g} s (--header-timeout)\n".encode()
            # h11 answers only a request it has read: the 408 goes out as raw bytes
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                                 b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
                                 + body)  # fmt: skip
            self.transport.close()

    return HeaderTimeout
