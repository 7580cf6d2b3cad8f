"""A request body's size is limited while it is read (413 before the body is read or parsed), so
one oversized request cannot stall the others; bad listening options are one line before the
target loads."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from serving import Server, http

from headstart.cli import main


@pytest.fixture(scope="module")
def small_limit(tiny_llama, tmp_path_factory):
    srv = Server(tiny_llama, None, tmp_path_factory.mktemp("limits"), "--max-body-mb", "1", "--max-batch", "8",
                 "--body-timeout", "3", "--header-timeout", "2")  # fmt: skip
    yield srv
    assert srv.stop() == 0, srv.output()


def _read_reply(conn: socket.socket) -> str:
    """An HTTP reply read whole (headers, then as many body bytes as Content-Length says)."""
    data = b""
    while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    while len(body) < length and (chunk := conn.recv(65536)):
        body += chunk
    return (head + b"\r\n\r\n" + body).decode()


def _chat(url: str, model: str, text: str, max_tokens: int = 8) -> tuple[int, str, float]:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                       "temperature": 0})  # fmt: skip
    started = time.perf_counter()
    status, reply = http("POST", f"{url}/v1/chat/completions", body.encode(), timeout=120)
    return status, reply, time.perf_counter() - started


def test_an_oversized_body_is_refused_before_it_is_read(small_limit):
    """Content-Length over the limit: 413 in OpenAI's shape, the body never sent in full."""
    with socket.create_connection(("127.0.0.1", small_limit.port), timeout=10) as conn:
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {30 * 2**20}\r\n\r\n").encode()  # fmt: skip
        conn.sendall(head + b'{"messages": "')  # 30 MB promised, a few bytes sent: the answer comes anyway
        reply = _read_reply(conn)
    assert reply.startswith("HTTP/1.1 413"), reply
    error = json.loads(reply.split("\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_too_large" and "1 MiB" in error["message"]
    assert (
        'headstart_requests_total{endpoint="/v1/chat/completions",status="413"}'
        in http("GET", f"{small_limit.url}/metrics")[1]
    )


def test_a_body_that_stops_coming_gets_a_408_and_its_connection_closes(small_limit):
    """Headers and part of a body, then nothing: 408 at --body-timeout, the connection closed (60
    such clients held theirs open for good), for declared and chunked bodies alike; the server
    answers others meanwhile, and a body sent slowly but whole within the time is served."""
    heads = [
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"a":\r\n',
    ]
    conns = [socket.create_connection(("127.0.0.1", small_limit.port), timeout=20) for _ in range(6)]
    started = time.perf_counter()
    try:
        for i, conn in enumerate(conns):
            conn.sendall(heads[i % 2] + (b'{"prompt": "x", ' if i % 2 == 0 else b""))
        assert http("GET", f"{small_limit.url}/health")[0] == 200  # not stalled by them
        for conn in conns:
            reply = _read_reply(conn)
            assert reply.startswith("HTTP/1.1 408"), reply
            assert json.loads(reply.split("\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
            assert conn.recv(1) == b""  # closed by the server
    finally:
        for conn in conns:
            conn.close()
    assert 2.5 < time.perf_counter() - started < 15
    body = json.dumps({"model": small_limit.model, "prompt": "hi", "max_tokens": 2}).encode()
    with socket.create_connection(("127.0.0.1", small_limit.port), timeout=30) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))  # fmt: skip
        for part in (body[:10], body[10:]):  # slowly, within the time
            conn.sendall(part)
            time.sleep(1)
        assert _read_reply(conn).startswith("HTTP/1.1 200")


def test_headers_that_stop_coming_get_a_408_and_their_connection_closes(small_limit):
    """Part of the headers (or nothing at all after connecting), then nothing: 408 at
    --header-timeout and the connection closed (they were held open as long as the client liked);
    the server answers others meanwhile; headers sent slowly but whole in time are served, and so is
    a second request on a kept-alive connection."""
    partial = [b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty", b"GET /hea", b""]
    conns = [socket.create_connection(("127.0.0.1", small_limit.port), timeout=30) for _ in partial]
    try:
        for conn, head in zip(conns, partial, strict=True):
            if head:
                conn.sendall(head)
        assert http("GET", f"{small_limit.url}/health")[0] == 200
        for conn in conns:
            reply = _read_reply(conn)
            assert reply.startswith("HTTP/1.1 408") and "--header-timeout" in reply, reply
            assert conn.recv(1) == b""
    finally:
        for conn in conns:
            conn.close()
    with socket.create_connection(("127.0.0.1", small_limit.port), timeout=30) as conn:
        for part in (b"GET /health HTTP/1.1\r\n", b"Host: x\r\n", b"\r\n"):  # slowly, within the time
            conn.sendall(part)
            time.sleep(0.5)
        assert _read_reply(conn).startswith("HTTP/1.1 200")
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")  # kept alive
        assert _read_reply(conn).startswith("HTTP/1.1 200")


def test_a_chunked_oversized_body_is_cut_off(small_limit):
    """No Content-Length (chunked): refused once the bytes read pass the limit."""
    with socket.create_connection(("127.0.0.1", small_limit.port), timeout=30) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        chunk = b"x" * 65536
        try:
            for _ in range(40):  # 2.5 MiB, past the 1 MiB limit
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass  # the server may close the connection once it has answered
        reply = _read_reply(conn)
    assert reply.startswith("HTTP/1.1 413"), reply


def _send_big(port: int, size: int) -> str:
    """A `size`-byte chat body sent whole, as a client that ignores an early answer would; the reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {size}\r\n\r\n".encode())  # fmt: skip
        try:
            conn.sendall(b"x" * size)
        except OSError:
            pass  # the server answered and closed before the body was all sent
        return _read_reply(conn)


def test_one_oversized_request_does_not_stall_twenty_normal_ones(small_limit):
    """Twenty normal chats at once, with a 30 MB one among them: each normal one answers within
    its usual time, measured alone on the same server first."""
    alone = min(_chat(small_limit.url, small_limit.model, "Say hi.")[2] for _ in range(3))
    results: list[tuple[int, str, float]] = []
    big: list[str] = []
    threads = [threading.Thread(target=lambda: big.append(_send_big(small_limit.port, 30 * 2**20)))]
    threads += [
        threading.Thread(target=lambda: results.append(_chat(small_limit.url, small_limit.model, "Say hi.")))
        for _ in range(20)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert big and big[0].startswith("HTTP/1.1 413"), big
    assert len(results) == 20 and all(status == 200 for status, _, _ in results)
    # 20 requests share up to 8 rows: the slowest waits for two batches ahead of it, plus slack for
    # a loaded machine; an 18 s stall (the 30 MB body read and tokenised) would be far past it
    assert max(seconds for _, _, seconds in results) < 20 * alone + 5, (alone, sorted(r[2] for r in results))


@pytest.mark.parametrize("argv, message", [
    (["--host", "999.1.1.1"], "--host '999.1.1.1' is not an address this machine can listen on"),
    (["--host", "not a host"], "--host 'not a host' is not an address this machine can listen on"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
    (["--max-body-mb", "0"], "--max-body-mb must be > 0, got 0.0"),
])  # fmt: skip
def test_bad_listening_options_are_one_line(tiny_llama, argv, message, capsys):
    assert main(["serve", "--target", str(tiny_llama), *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_a_port_in_use_is_one_line(tiny_llama, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--target", str(tiny_llama), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "choose another --port" in err, err


def test_a_500_carries_the_cors_headers(tmp_path):
    """A handler that crashes (here a tokenizer that raises) is answered inside the CORS layer:
    a browser page of an allowed origin reads the 500's JSON, not an opaque network error."""
    import urllib.request

    import uvicorn
    from serving import free_port

    from headstart.serve.app import build_app
    from headstart.serve.metrics import Metrics
    from headstart.serve.served import Served

    class Broken:
        def __call__(self, *args, **kwargs):
            raise RuntimeError("a bug")

    class Target:
        tokenizer = Broken()

    served = Served(target=Target(), scheduler=None, metrics=Metrics(), model="m", context=64, max_tokens=8,
                    default_tokens=8, allowed_origins=("http://ui.example",))  # fmt: skip
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(build_app(served), host="127.0.0.1", port=port, log_level="critical")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if server.started:
                break
            time.sleep(0.05)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", data=b'{"prompt": "hi"}', method="POST",
                                         headers={"Content-Type": "application/json", "Origin": "http://ui.example"})  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=30)
        assert err.value.code == 500
        assert err.value.headers["access-control-allow-origin"] == "http://ui.example"
        assert json.loads(err.value.read())["error"]["type"] == "server_error"
    finally:
        server.should_exit = True
        thread.join(10)
