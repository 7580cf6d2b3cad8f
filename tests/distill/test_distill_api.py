"""`--engine openai`: replies from an OpenAI-compatible server.

A small real HTTP server (stdlib) checks retries and refusals; the slow test starts a real
`transformers serve` (transformers' `serving` extra) on the tiny target, SIGKILLs a distill run
mid-way and resumes it: no record lost or duplicated."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from headstart.distill import load_distilled
from headstart.distill.api import Endpoint, OpenAIEngine
from headstart.errors import HeadstartError
from headstart.inference.plain import SamplingConfig
from headstart.inference.requests import Request

REPO = Path(__file__).resolve().parents[2]


class FlakyServer(BaseHTTPRequestHandler):
    """503 for the first `fail` requests, then a chat completion echoing the user message."""

    fail = 2
    seen: list[dict] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        if self.path == "/html/chat/completions":  # a web server that does not speak the API
            page = (
                b"<!DOCTYPE html>\n<html><head><title>501 Not Implemented</title></head>\n<body>\n"
                + (b"<h1>Not Implemented</h1>\n<p>POST is not supported here.</p>\n" * 5)
                + b"</body></html>\n"
            )
            self.send_response(501)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        if self.path == "/page/chat/completions":  # a proxy's login page, served with 200
            page = b"<html><head><title>Sign in - Corp Proxy</title></head><body>...</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        if self.path == "/empty/chat/completions":  # a reasoning model whose text went elsewhere
            data = json.dumps({"choices": [{"message": {"role": "assistant", "content": None},
                                            "finish_reason": "length"}]}).encode()  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if self.path != "/v1/chat/completions":
            self.send_response(404)
            self.end_headers()
            return
        if len(type(self).seen) <= type(self).fail:
            self.send_response(503)
            self.send_header("Retry-After", "0")
            self.end_headers()
            return
        answer = {"choices": [{"message": {"role": "assistant", "content": "re: " + body["messages"][-1]["content"]},
                               "finish_reason": "stop"}]}  # fmt: skip
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky_server():
    FlakyServer.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FlakyServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def _request(key, text):
    messages = [{"role": "user", "content": text}]
    return Request(
        key=key, prompt=[1, 2], sampling=SamplingConfig(max_new_tokens=8), seed=3, messages=messages
    )


def test_replies_survive_server_errors_and_follow_ups_run(distill_target, flaky_server):
    waits = []
    engine = OpenAIEngine(
        distill_target.tokenizer, Endpoint(flaky_server, "tiny", concurrency=2), sleep=waits.append
    )
    got = {}

    def on_reply(request, reply):
        got[request.key] = distill_target.tokenizer.decode(reply.token_ids)
        return [_request("follow", "second turn")] if request.key == "a" else None

    stats = engine.run([_request("a", "hello"), _request("b", "there")], on_reply)
    assert got == {"a": "re: hello", "b": "re: there", "follow": "re: second turn"}
    assert stats.replies == 3 and len(waits) == 2  # two 503s, each retried after Retry-After
    assert FlakyServer.seen[-1]["model"] == "tiny" and FlakyServer.seen[-1]["max_tokens"] == 8


def test_a_server_that_keeps_failing_or_refuses_is_one_line(distill_target, flaky_server):
    FlakyServer.fail = 100
    try:
        engine = OpenAIEngine(
            distill_target.tokenizer, Endpoint(flaky_server, "tiny", max_retries=2), sleep=lambda s: None
        )
        with pytest.raises(
            HeadstartError, match="failed 3 times.*HTTP 503.*rerun the same command to resume"
        ):
            engine.run([_request("a", "hi")], lambda r, p: None)
    finally:
        FlakyServer.fail = 2
    wrong = OpenAIEngine(distill_target.tokenizer, Endpoint(flaky_server.removesuffix("/v1"), "tiny"))
    with pytest.raises(HeadstartError, match="refused the request.*HTTP 404.*--model") as refused:
        wrong.run([_request("a", "hi")], lambda r, p: None)
    assert "\n" not in refused.value.one_line()
    html = OpenAIEngine(distill_target.tokenizer, Endpoint(flaky_server.replace("/v1", "/html"), "tiny"))
    with pytest.raises(HeadstartError) as refused:
        html.run([_request("a", "hi")], lambda r, p: None)
    line = refused.value.one_line()  # the status and the page's title, not ten lines of HTML
    assert "HTTP 501" in line and "501 Not Implemented" in line and "<" not in line and "\n" not in line
    assert "/v1" in line and len(line) < 400
    from headstart.distill import DistillConfig

    with pytest.raises(HeadstartError, match="--engine openai needs the server's --base-url and --model"):
        DistillConfig(out="x", engine="openai")
    for url in ("ftp://example.com/v1", "localhost:8000/v1", "http://", "http://host:99999/v1"):
        start = time.perf_counter()  # refused at once, not after six tries
        with pytest.raises(HeadstartError, match="--base-url"):
            DistillConfig(out="x", engine="openai", base_url=url, model="m")
        assert time.perf_counter() - start < 1.0


def test_a_web_page_with_status_200_is_not_retried(distill_target, flaky_server):
    waits = []
    page = OpenAIEngine(distill_target.tokenizer, Endpoint(flaky_server.replace("/v1", "/page"), "tiny"),
                        sleep=waits.append)  # fmt: skip
    FlakyServer.seen = []
    with pytest.raises(
        HeadstartError, match="answered with a web page, not JSON .'Sign in - Corp Proxy'."
    ) as err:
        page.run([_request("a", "hi")], lambda r, p: None)
    assert waits == [] and len(FlakyServer.seen) == 1  # one request, no retry
    assert "/v1" in err.value.fix


def test_empty_replies_are_counted_and_said_once(distill_target, flaky_server, caplog):
    empty = OpenAIEngine(distill_target.tokenizer, Endpoint(flaky_server.replace("/v1", "/empty"), "tiny"))
    empty.run([_request("a", "hi"), _request("b", "there")], lambda r, p: None)
    warnings = [r.getMessage() for r in caplog.records if "were empty" in r.getMessage()]
    assert len(warnings) == 1 and "2 of 2 replies" in warnings[0] and "chat template" in warnings[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HangingServer(BaseHTTPRequestHandler):
    """Takes requests and never answers them in time."""

    asked = threading.Event()

    def do_POST(self):  # noqa: N802 (http.server's name)
        type(self).asked.set()
        time.sleep(60)

    def log_message(self, *args):
        pass


def test_sigterm_with_requests_in_flight_ends_the_run_at_once(tiny_llama, tmp_path):
    """The request threads were joined at exit: one SIGTERM (or Ctrl-C) said "interrupted" and
    then waited for every request in flight, up to timeout_s (600 s) times its retries."""
    HangingServer.asked.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), HangingServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    source = tmp_path / "p.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(4)))
    cmd = [sys.executable, "-m", "headstart", "-q", "distill", "--target", str(tiny_llama), "--prompts", str(source),
           "--out", str(tmp_path / "out"), "--num", "4", "--max-new-tokens", "8", "--max-prompt-tokens", "64",
           "--engine", "openai", "--base-url", f"http://127.0.0.1:{server.server_address[1]}/v1", "--model", "m"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert HangingServer.asked.wait(120), proc.stderr.read().decode()[-2000:]
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=50)
        assert time.monotonic() - sent < 15 and code != 0
        assert "interrupted" in proc.stderr.read().decode()
    finally:
        proc.kill()
        server.shutdown()
        server.server_close()


@pytest.mark.slow
@pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import fastapi, uvicorn"], capture_output=True).returncode != 0,
    reason="needs transformers' serving extra (pip install 'transformers[serving]')",
)
def test_distill_through_transformers_serve_resumes_after_sigkill(tiny_llama, tmp_path):
    port = _free_port()
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    server = subprocess.Popen([sys.executable, "-m", "transformers.cli.transformers", "serve", str(tiny_llama),
                               "--host", "127.0.0.1", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        import urllib.request

        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail("transformers serve did not come up")
        source = tmp_path / "p.jsonl"
        source.write_text("".join(json.dumps({"prompt": f"question number {i}"}) + "\n" for i in range(12)))
        out = tmp_path / "out"
        cmd = [sys.executable, "-m", "headstart", "-q", "distill", "--target", str(tiny_llama), "--prompts", str(source),
               "--out", str(out), "--num", "12", "--max-new-tokens", "16", "--shard-size", "2", "--batch-size", "2",
               "--max-prompt-tokens", "64",
               "--engine", "openai", "--base-url", f"http://127.0.0.1:{port}/v1", "--model", str(tiny_llama),
               "--concurrency", "2"]  # fmt: skip
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 300
        while (
            time.time() < deadline
            and len(list((out / "data").glob("shard-*.jsonl"))) < 2
            and proc.poll() is None
        ):
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]  # the kill lands mid-run
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        killed_at = len(load_distilled(out))
        assert 0 < killed_at < 12
        rerun = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        rows = load_distilled(out)
        assert sorted(rows["index"]) == list(range(12))  # none lost, none twice
        assert all(sum(mask) > 0 for mask in rows["loss_mask"])  # every record has a reply to learn
    finally:
        server.terminate()
        server.wait(timeout=30)
