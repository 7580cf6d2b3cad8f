#!/usr/bin/env python
"""lm-evaluation-harness against `headstart serve`, with heads and without: the scores and every
sample's loglikelihoods and generations must be identical (heads change no answer and no score).

    python scripts/eval_serve.py                          # smollm2: its shipped heads vs --no-heads
    python scripts/eval_serve.py --limit 5 --serve "--target smollm2 --threads 2"

1. lm-eval lives in its OWN virtualenv (`--venv`, default ~/.cache/headstart/lm-eval-venv), made
   on first use with `lm-eval[api]==0.4.13` (pinned); nothing is installed in the project's.
2. For each mode (heads: `headstart serve SERVE`; no heads: `... --no-heads`) a server starts on
   a free loopback port and lm-eval runs against it with `--model local-completions` and its
   DEFAULT request settings: tokenized requests (token-id prompts), batch size 1, and the
   tokenizer found at the server's /tokenizer_info (tokenizer_backend=auto), on two tasks whose
   data is in the repository (scripts/eval_tasks/: a 30-question multiple choice task, scored by
   loglikelihood, and a 20-question generation task, scored by exact match).
3. The two runs' metrics and per-sample responses (each choice's summed logprob and is_greedy;
   each generated text) are compared, value for value; exit 1 at the first difference.
Output: lm-eval's results and samples under --out/<date-time>/<mode>/, a summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LM_EVAL = "lm-eval[api]==0.4.13"
TASKS = "headstart_facts_mc,headstart_answers_gen"


def lm_eval_venv(venv: Path) -> Path:
    """The venv's python, made (and lm-eval installed) when its stamp is missing."""
    python, stamp = venv / "bin" / "python", venv / f".installed-{LM_EVAL}"
    if not stamp.exists():
        print(f"installing {LM_EVAL} into {venv} (its own virtualenv)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", LM_EVAL], check=True)
        stamp.touch()
    return python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(words: list[str], log: Path) -> tuple[subprocess.Popen, str, str]:
    """`headstart serve WORDS` on a free port (its log in LOG); its URL and model id."""
    port = free_port()
    cmd = [sys.executable, "-m", "headstart", "serve", "--port", str(port), *words]
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"headstart serve failed (its log: {log}):\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as reply:
                return proc, url, json.loads(reply.read())["data"][0]["id"]
        except OSError:
            time.sleep(0.5)
    proc.kill()
    sys.exit(f"headstart serve did not answer in 600 s (its log: {log})")


def run_lm_eval(python: Path, url: str, model: str, out: Path, args: argparse.Namespace) -> float:
    cmd = [str(python), "-m", "lm_eval", "run", "--model", "local-completions",
           "--model_args", f"model={model},base_url={url}/v1/completions", "--tasks", args.tasks,
           "--include_path", str(ROOT / "scripts" / "eval_tasks"), "--log_samples", "--output_path", str(out)]  # fmt: skip
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    # the hub is never needed (local data, the server's tokenizer): offline, no retries to wait on
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OPENAI_API_KEY": ""}
    print("$ " + shlex.join(cmd), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)  # cwd: the tasks' data paths are relative to it
    return time.perf_counter() - start


def tau(url: str) -> str:
    """The server's tau from /metrics (generation only: a loglikelihood request decodes one token)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
        lines = reply.read().decode().splitlines()
    return next((line.split()[-1] for line in lines if line.startswith("headstart_tau ")), "?")


def collect(out: Path) -> tuple[dict, dict]:
    """(metrics by task, responses by (task, doc_id)) of one lm-eval run."""
    results = json.loads(max(out.rglob("results_*.json")).read_text())["results"]
    samples = {}
    for path in out.rglob("samples_*.jsonl"):
        task = path.name.removeprefix("samples_").rsplit("_", 1)[0]
        for line in path.read_text().splitlines():
            row = json.loads(line)
            samples[(task, row["doc_id"])] = row["resps"]
    return results, samples


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--serve", default="--target smollm2", help="arguments of `headstart serve` (heads on)"
    )
    parser.add_argument("--tasks", default=TASKS)
    parser.add_argument("--limit", type=int, default=None, help="the first N documents of each task")
    parser.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "headstart" / "lm-eval-venv")
    parser.add_argument("--out", type=Path, default=Path.home() / ".cache" / "headstart" / "eval-serve")
    args = parser.parse_args()
    python = lm_eval_venv(args.venv)
    runs, taus, stamp = {}, {}, time.strftime("%Y%m%d-%H%M%S")
    for mode, extra in (("heads", []), ("no-heads", ["--no-heads"])):
        out = args.out / stamp / mode
        out.mkdir(parents=True, exist_ok=True)
        proc, url, model = start_serve([*shlex.split(args.serve), *extra], out / "serve.log")
        try:
            seconds = run_lm_eval(python, url, model, out, args)
            taus[mode] = tau(url)
        finally:
            proc.terminate()
            proc.wait(60)
        runs[mode] = (*collect(out), seconds)
    (heads, heads_samples, heads_s), (plain, plain_samples, plain_s) = runs["heads"], runs["no-heads"]
    for task in sorted(heads):
        print(
            f"{task}: heads {json.dumps(heads[task])}\n{' ' * len(task)}  no heads {json.dumps(plain[task])}"
        )
    print(
        f"lm-eval wall time: heads {heads_s:.0f} s, no heads {plain_s:.0f} s; {len(heads_samples)} samples; "
        f"tau (tokens committed per verify forward, bonus included): heads {taus['heads']}, no heads {taus['no-heads']}"
    )
    if heads != plain:
        print("DIFFERENT metrics with heads and without")
        return 1
    if heads_samples.keys() != plain_samples.keys():
        print("DIFFERENT samples with heads and without")
        return 1
    for key in sorted(heads_samples):
        if heads_samples[key] != plain_samples[key]:
            print(f"DIFFERENT responses for {key}: {heads_samples[key]} vs {plain_samples[key]}")
            return 1
    print(
        f"identical: every metric and all {len(heads_samples)} samples' responses (logprobs to the last digit)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
