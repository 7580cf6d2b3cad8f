#!/usr/bin/env python
"""Load on an OpenAI-compatible server: N requests at each concurrency, streamed, greedy; the
aggregate output tokens/s, time to first token and request latency (p50/p99), and every failed
or cut-short response. A script, not a test: the figures depend on the machine.

    # headstart serve, with its shipped heads and without, then llama-server on the same GGUF:
    python scripts/bench_serve.py --serve "--target smollm2" --serve "--target smollm2 --no-heads" \\
        --url http://127.0.0.1:8080/v1 --questions ../shared/data/eval/mt_bench/question.jsonl \\
        --requests 32 --concurrency 1 4 8 --max-tokens 128

`--serve ARGS` starts `headstart serve ARGS` on a free port for its runs and stops it after;
`--url` measures a server that is already running (llama-server: `llama-server -m GGUF --port
8080 -np 8 -cb`). Output: a markdown table (and `--output FILE.json`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's headstart, installed or not (a bare GPU machine)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def one_request(client: object, model: str, prompt: str, max_tokens: int) -> dict:
    start = time.perf_counter()
    first = None
    text, usage, finish = [], None, None
    try:
        stream = client.chat.completions.create(  # type: ignore[attr-defined]
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
            stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        for chunk in stream:
            if chunk.choices:
                delta = chunk.choices[0].delta.content
                if delta and first is None:
                    first = time.perf_counter() - start
                text.append(delta or "")
                finish = chunk.choices[0].finish_reason or finish
            if getattr(chunk, "usage", None):
                usage = chunk.usage
    except Exception as err:  # noqa: BLE001 - a failed request is a result here
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}
    tokens = usage.completion_tokens if usage else None
    return {"ok": finish in ("stop", "length") and tokens is not None, "ttft": first,
            "latency": time.perf_counter() - start, "tokens": tokens or 0, "finish": finish}  # fmt: skip


def measure(url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int) -> dict:
    import openai

    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
    one_request(client, model, prompts[0], 8)  # warm-up
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda p: one_request(client, model, p, max_tokens), prompts))
    wall = time.perf_counter() - start
    good = [r for r in results if r["ok"]]
    ttft = [r["ttft"] for r in good if r["ttft"] is not None]
    latency = [r["latency"] for r in good]
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "failed": len(results) - len(good),
        "errors": sorted({r.get("error", r.get("finish")) for r in results if not r["ok"]}, key=str)[:3],
        "tokens": sum(r["tokens"] for r in good),
        "wall_s": round(wall, 2),
        "tokens_per_s": round(sum(r["tokens"] for r in good) / wall, 2),
        "ttft_p50_s": round(percentile(ttft, 0.5), 3),
        "ttft_p99_s": round(percentile(ttft, 0.99), 3),
        "latency_p50_s": round(percentile(latency, 0.5), 2),
        "latency_p99_s": round(percentile(latency, 0.99), 2),
        "mean_latency_s": round(statistics.mean(latency), 2) if latency else None,
    }


def start_serve(args_text: str, log: Path) -> tuple[subprocess.Popen, str, str]:
    """`headstart serve ARGS` on a free port, its stderr in LOG (a pipe nobody reads fills up and
    stalls the server once it has logged 64 KiB); its URL and model id once /v1/models answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    words = shlex.split(args_text)
    cmd = [sys.executable, "-m", "headstart", "serve", "--port", str(port), *words]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sink, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"headstart serve {args_text} failed (its log: {log}):\n{tail(log)}")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as reply:
                model = json.loads(reply.read())["data"][0]["id"]
            return proc, f"{url}/v1", model
        except OSError:
            time.sleep(0.5)
    proc.kill()
    sys.exit(f"headstart serve {args_text} did not answer in 300 s (its log: {log}):\n{tail(log)}")


def tail(log: Path, chars: int = 2000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else ""


def save(rows: list[dict], output: str | None) -> None:
    """The rows so far, rewritten after each (a run cut short keeps what it measured)."""
    if output:
        path = Path(output)
        path.with_suffix(".tmp").write_text(json.dumps(rows, indent=2))
        path.with_suffix(".tmp").replace(path)


def served_model(url: str) -> str:
    with urllib.request.urlopen(f"{url}/models", timeout=10) as reply:
        return json.loads(reply.read())["data"][0]["id"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--serve", action="append", default=[], help="arguments of a `headstart serve` to start"
    )
    parser.add_argument("--url", action="append", default=[], help="an already running server's /v1 URL")
    parser.add_argument("--questions", required=True)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument(
        "--first", action="store_true", help="the file's first N questions (default: spread over it)"
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--output", default=None, help="the rows as JSON, rewritten after each")
    parser.add_argument(
        "--logs", default=None, help="folder for each started server's log (default: a temporary one)"
    )
    args = parser.parse_args()

    from headstart.bench.questions import load_questions

    questions = [q.turns[0] for q in load_questions(args.questions)]
    if args.first or args.requests >= len(questions):
        prompts = [questions[i % len(questions)] for i in range(args.requests)]
    else:  # evenly spread over the file: every category of an MT-bench-ordered file, not the first few
        prompts = [questions[i * len(questions) // args.requests] for i in range(args.requests)]
    rows: list[dict] = []
    logs = Path(args.logs or tempfile.mkdtemp(prefix="bench-serve-"))
    logs.mkdir(parents=True, exist_ok=True)
    servers = [("serve " + s, s) for s in args.serve] + [(u, None) for u in args.url]
    for number, (label, serve_args) in enumerate(servers):
        proc = None
        if serve_args is not None:
            proc, url, model = start_serve(serve_args, logs / f"serve-{number}.log")
        else:
            url, model = label, served_model(label)
        try:
            for concurrency in args.concurrency:
                row = {"server": label, **measure(url, model, prompts, concurrency, args.max_tokens)}
                rows.append(row)
                save(rows, args.output)
                print(json.dumps(row), file=sys.stderr)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=120)
    print(f"{args.requests} requests a concurrency, {args.max_tokens} max tokens, greedy, streamed\n")
    print("| server | concurrency | tok/s | vs concurrency 1 | TTFT p50/p99 s | latency p50/p99 s | failed |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        base = next(
            r for r in rows if r["server"] == row["server"] and r["concurrency"] == min(args.concurrency)
        )
        ratio = row["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else float("nan")
        print(f"| {row['server']} | {row['concurrency']} | {row['tokens_per_s']} | {ratio:.2f}x | "
              f"{row['ttft_p50_s']}/{row['ttft_p99_s']} | {row['latency_p50_s']}/{row['latency_p99_s']} | "
              f"{row['failed']} |")  # fmt: skip


if __name__ == "__main__":
    main()
