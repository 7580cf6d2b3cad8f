#!/usr/bin/env python
"""How late `headstart serve` answers what still runs when SIGTERM's --grace ends, under load: N
streamed requests with long prompts and long replies, SIGTERM once they all stream, then the time
from the end of the grace period to each request's last byte (its 503 error event) and to the
server's exit. A script, not a test: the figures depend on the machine.

    python scripts/probe_grace.py --serve "--target smollm2 --threads 2" --clients 8 --grace 1

Prints one JSON object (lateness in seconds: max and median over the requests, and the exit's).
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, proc: subprocess.Popen, limit: float = 300) -> None:
    deadline = time.time() + limit
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise SystemExit("the server did not start")


def stream(url: str, model: str, prompt: str, max_tokens: int, started: threading.Event, ended: dict) -> None:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True}).encode()  # fmt: skip
    request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=600) as reply:
            for _line in reply:
                started.set()
    except OSError as err:
        ended["error"] = str(err)[:200]
    finally:
        ended["at"] = time.monotonic()
        started.set()  # a refused request must not hold the probe up


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", default="--target smollm2 --threads 2", help="`headstart serve` arguments")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--grace", type=float, default=1.0)
    parser.add_argument("--prompt-words", type=int, default=450, help="words per prompt (~600 tokens)")
    parser.add_argument("--max-tokens", type=int, default=400)
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "headstart", "serve", *shlex.split(args.serve), "--port", str(port),
           "--grace", str(args.grace), "--max-batch", str(args.clients)]  # fmt: skip
    log = tempfile.NamedTemporaryFile("w+", prefix="probe-grace-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_up(url, proc)
        model = json.loads(urllib.request.urlopen(f"{url}/v1/models").read())["data"][0]["id"]
        words = " ".join(f"word{i % 97}" for i in range(args.prompt_words))
        events = [threading.Event() for _ in range(args.clients)]
        ends: list[dict] = [{} for _ in range(args.clients)]
        threads = [
            threading.Thread(
                target=stream, args=(url, model, f"{i}: {words}", args.max_tokens, events[i], ends[i])
            )
            for i in range(args.clients)
        ]
        for thread in threads:
            thread.start()
        for event in events:
            event.wait(300)
        time.sleep(1.0)  # every request decoding
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(600)
        code = proc.wait(600)
        exited = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
    due = sent + args.grace
    errors = [end["error"] for end in ends if "error" in end]
    if errors:
        print(f"{len(errors)} requests failed before SIGTERM's answer: {errors[0]}", file=sys.stderr)
    late = [end["at"] - due for end in ends if "at" in end]
    print(json.dumps({"clients": args.clients, "grace_s": args.grace, "serve": args.serve,
                      "late_s_max": round(max(late), 2), "late_s_median": round(statistics.median(late), 2),
                      "exit_after_grace_s": round(exited - due, 2), "exit_code": code,
                      "log": str(Path(log.name))}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
