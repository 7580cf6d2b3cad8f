"""Helpers of the serve tests: `headstart serve` as a real process on a loopback port, plain
HTTP requests (the raw bytes a client may send), and what `headstart generate` says."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def http(method: str, url: str, body: bytes | None = None, timeout: float = 30) -> tuple[int, str]:
    """(status, body text) of a plain HTTP request (stdlib: the raw bytes a client may send)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url, data=body, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, target: Path, heads: Path | None, tmp: Path, *extra: str) -> None:
        self.port = free_port()
        self.model = str(target)
        cmd = [sys.executable, "-m", "headstart", "serve", "--target", str(target), "--port", str(self.port),
               "--threads", "1", *(["--heads", str(heads)] if heads else [] if "--draft-model" in extra else
                                    ["--no-heads"]), *extra]  # fmt: skip
        if (
            heads and "--speculate" not in extra and "--tree" not in extra
        ):  # the random heads, not calibration's verdict
            cmd += ["--speculate", "always"]
        env = dict(os.environ, HEADSTART_CACHE=str(tmp / "cache"), TOKENIZERS_PARALLELISM="false")
        self.log = (tmp / f"serve-{self.port}.log").open("w+")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 120
        while time.time() < deadline:
            assert self.proc.poll() is None, self.output()
            try:
                if http("GET", f"{self.url}/health", timeout=1)[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"server did not start:\n{self.output()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, key: str = "none", **kwargs):  # -> openai.OpenAI
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, **kwargs)

    def output(self) -> str:
        return Path(self.log.name).read_text()

    def wait_for(self, text: str, timeout: float = 10.0) -> str:
        """The log once it holds `text` (the start-up line is logged just after the port answers
        /health: a read right after start-up can come first)."""
        deadline = time.time() + timeout
        while text not in self.output() and time.time() < deadline:
            time.sleep(0.05)
        return self.output()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            self.log.close()


def generate_text(tiny_llama, heads, prompt: str, max_tokens: int, raw: bool = False) -> str:
    """What `headstart generate` says for the prompt (same target, heads and tree)."""
    from headstart.cli import main

    args = ["generate", "--target", str(tiny_llama), "--heads", str(heads), "--prompt", prompt, "--max-new-tokens",
            str(max_tokens), "--json", "-q", *(["--raw"] if raw else [])]  # fmt: skip
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(args) == 0
    return json.loads(out.getvalue())["text"]
