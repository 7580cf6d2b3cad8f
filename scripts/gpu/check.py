#!/usr/bin/env python
"""The GPU check, prepared to run on a bare machine (PyTorch + CUDA + transformers) in
one to three calls of under 10 minutes each, every figure written to --out as it is measured.

Sections (--sections, in this order; each skips itself when the time budget runs out):
  pytest   `pytest -m gpu tests/inference` (exactness on CUDA), output in pytest.txt
  shape8b  a random-weight target of Llama-3.1-8B's shape in bf16, built on the device from a
           config (no download): ms per verify of 1, 8, 16, 32 and 64 chained nodes after a
           512-token prefix, eager and captured (--compile), beside the memory-bandwidth bound
           (weight bytes / the card's HBM bandwidth), and the speed-up each predicts at tau
           2, 3 and 4 (tau x t(1) / t(n); the drafter's cost is not in it)
  smollm2  the embedded SmolLM2 (the GGUF given by --target) on the first --questions
           questions, --max-new-tokens tokens, bf16, batch 1: transformers' `generate` eager
           and with its static cache (compiled by transformers), headstart plain, Medusa and
           EAGLE-3 (the shipped heads; eagle3tuned_*: their tuned tree, eagle3ref_*: EAGLE's
           reference tree, dynamic, depth 6, top-k 10, 60 nodes; eagle3_*: the default static
           tree), each eager and captured; tok/s, ms per target forward,
           tau, and each method's tokens against `generate`'s. Methods are interleaved per
           question; one warm-up question (not timed) compiles the graphs first.
  replay8b the loop at Llama-3.1-8B's shape (random weights, bf16) without trained heads: plain
           captured decoding against the replay drafter (`--draft-model replay:accept=P`, the
           target's own greedy continuation, each draft wrong with probability 1 - P) at P 0.6
           and 0.8, chain 2, chain 4 and the 60-node tree: tau, each round's ms and counts (host
           reads, compiled calls, eager ops), the round in plain steps (issue 68's goal: <= 1.3)
  serve    the serving load on the device: `headstart serve` on the same GGUF with the shipped
           heads and with --no-heads, each driven by scripts/bench_serve.py (the `openai` client,
           --serve-requests streamed greedy requests at concurrency 1, 4 and 8, --max-new-tokens
           each): aggregate tok/s, TTFT and latency p50/p99, failed responses; serve.json and the
           servers' logs. Needs fastapi, uvicorn and openai, which the image lacks: gpu/stage.sh
           puts their wheels in .gpu/serve-wheels (carry it; the call installs them first).

The machine is bare and reaches nothing: `scripts/gpu/stage.sh` (run here first) fills the
ignored folder .gpu/ with what it lacks (wheels for gguf and datasets, 40 MT-bench questions, the
GGUF in four parts of 25 MB, since a call carries at most 64 MiB with the repository)
and prints the device commands. Dry run on a CPU: `python scripts/gpu/check.py --dry-run
--out /tmp/gc` (tiny shapes, 2 questions, 16 tokens, the CPU).

Outputs in --out: gpu_check.json (every figure, rewritten after each), gpu_check.log, pytest.txt,
serve.json and serve-logs.tar.gz.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# EAGLE-2/3's reference tree (depth 6, top-k 10, 60 nodes), as the CPU reports name it
EAGLE_REFERENCE_TREE = "dynamic:depth=6,top_k=10,total_tokens=60"
HBM_BYTES_PER_S = {"H200": 4.8e12, "H100 NVL": 3.9e12, "H100 PCIe": 2.0e12, "H100": 3.35e12, "A100": 2.0e12}
LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0)  # fmt: skip
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000, max_position_embeddings=2048)  # fmt: skip


class Report:
    """gpu_check.json, rewritten (atomically) after every figure, and a log."""

    def __init__(self, out: Path, budget_s: float) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out, self.start, self.budget = out, time.monotonic(), budget_s
        self.path = out / "gpu_check.json"
        self.data: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.logf = (out / "gpu_check.log").open("a")

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def log(self, text: str) -> None:
        line = f"[{time.monotonic() - self.start:6.1f}s] {text}"
        print(line, flush=True)
        self.logf.write(line + "\n")
        self.logf.flush()

    def put(self, section: str, key: str, value: Any) -> None:
        self.data.setdefault(section, {})[key] = value
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)


def machine(report: Report, device: str) -> None:
    import torch
    import transformers

    card = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    report.put("machine", "card", card)
    report.put("machine", "torch", torch.__version__)
    report.put("machine", "transformers", transformers.__version__)
    report.put("machine", "date", time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    from headstart.provenance import placeheld

    # recorded without this machine's folders: --out as $OUT, any other absolute argument's folder as $STAGE
    argv = sys.argv
    out = {
        argv[i + 1]: "$OUT" for i, a in enumerate(argv[:-1]) if a == "--out" and argv[i + 1].startswith("/")
    }
    staged = out | {str(Path(a).parent): "$STAGE" for a in argv[1:] if a.startswith("/") and a not in out}
    report.put("machine", "command", placeheld(" ".join(sys.argv), staged))
    report.log(f"{card}, torch {torch.__version__}, transformers {transformers.__version__}")


# ---- pytest -------------------------------------------------------------------------------------
def section_pytest(args: argparse.Namespace, report: Report) -> None:
    limit = min(report.left() - 30, 300)
    if limit < 60:
        report.log("pytest: skipped (time)")
        return
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "tests/inference", "-p", "no:cacheprovider"]
    if args.dry_run:
        command += ["--collect-only"]
    report.log(f"pytest: {' '.join(command)} (at most {limit:.0f} s)")
    try:
        run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=limit)
        text, code = run.stdout + run.stderr, run.returncode
    except subprocess.TimeoutExpired as err:  # its output comes as bytes here, even with text=True
        told = [
            part.decode(errors="replace") if isinstance(part, bytes) else part or ""
            for part in (err.stdout, err.stderr)
        ]
        text, code = f"{''.join(told)}\nTIMED OUT after {limit:.0f} s", -1
    (report.out / "pytest.txt").write_text(text if isinstance(text, str) else text.decode())
    summary = [
        line for line in text.splitlines() if " passed" in line or " failed" in line or "error" in line
    ]
    report.put("pytest", "exit_code", code)
    report.put("pytest", "summary", summary[-1] if summary else text.strip().splitlines()[-1:])
    report.log(f"pytest: exit {code}: {summary[-1] if summary else '?'}")


# ---- a random target of Llama-3.1-8B's shape ------------------------------------------------------
def section_shape8b(args: argparse.Namespace, report: Report) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from headstart.inference.captured import CapturedVerify
    from headstart.targets import forward, new_cache

    if report.left() < 120:
        report.log("shape8b: skipped (time)")
        return
    device, dtype = args.device, torch.bfloat16 if args.device == "cuda" else torch.float32
    shape = TINY if args.dry_run else LLAMA_8B
    config = LlamaConfig(**shape, tie_word_embeddings=False, attn_implementation="sdpa")
    start = time.perf_counter()
    torch.set_default_dtype(dtype)
    with torch.device(device):
        model = LlamaForCausalLM(config).eval().requires_grad_(False)
    torch.set_default_dtype(torch.float32)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    report.put("shape8b", "weights_gb", round(weight_bytes / 1e9, 2))
    report.log(
        f"shape8b: built {weight_bytes / 1e9:.1f} GB of weights in {time.perf_counter() - start:.1f} s"
    )
    card = report.data.get("machine", {}).get("card", "cpu")
    bandwidth = next((bw for name, bw in HBM_BYTES_PER_S.items() if name in card), None)
    if bandwidth:
        bound = weight_bytes / bandwidth * 1e3
        report.put("shape8b", "bandwidth_bound_ms", round(bound, 3))
        report.put("shape8b", "hbm_bytes_per_s", bandwidth)
    prefix = 64 if args.dry_run else 512
    ids = torch.randint(0, config.vocab_size, (1, prefix), device=device)
    captured = CapturedVerify(model, (), backend=args.backend)
    cache = new_cache(model, reserve=prefix + 128)
    captured.adopt(cache)
    forward(model, ids, past_key_values=cache, logits_to_keep=1)  # the prefill (eager)

    results = _verify_times(args, report, model, cache, captured, prefix)
    if "1" in results:
        one = results["1"]["captured_ms"]
        if bandwidth:
            report.put("shape8b", "plain_step_over_bound", round(one / bound, 2))
        predicted = {
            n: {f"tau{tau}": round(tau * one / row["captured_ms"], 2) for tau in (2, 3, 4)}
            for n, row in results.items() if n != "1"
        }  # fmt: skip
        report.put("shape8b", "predicted_speedup_captured", predicted)
        if "16" in results:
            report.put("shape8b", "verify16_over_step1", round(results["16"]["captured_ms"] / one, 2))
    del model, cache, captured
    if device == "cuda":
        torch.cuda.empty_cache()


def _verify_times(args: argparse.Namespace, report: Report, model: Any, cache: Any, captured: Any,
                  prefix: int) -> dict[str, dict[str, float]]:  # fmt: skip
    """Median ms of a chained n-node verify after `prefix` cached tokens, eager and captured; the
    cache is cut back to the prefix after each."""
    import torch

    from headstart.inference import cache as kv
    from headstart.targets import forward, tree_attention_mask

    device = args.device
    visible = torch.ones(1, prefix, dtype=torch.bool, device=device)

    def timed(fn: Any, repeats: int) -> float:
        times = []
        for _ in range(repeats):
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    results: dict[str, dict[str, float]] = {}
    slowest = 0.0  # the longest compile so far: a bucket starts only with time for two of them
    for n in (1, 8, 16, 32, 64):
        if report.left() < 60 + 2 * slowest:
            report.log(f"shape8b: stopped before n={n} (time)")
            break
        tokens = torch.randint(0, model.config.vocab_size, (1, n), device=device)
        positions = prefix + torch.arange(n, device=device)[None]
        chain = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        mask = tree_attention_mask(visible, chain, model.dtype)

        def eager(tokens: Any = tokens, mask: Any = mask, positions: Any = positions) -> None:
            forward(model, tokens, attention_mask=mask, position_ids=positions, past_key_values=cache)
            kv.truncate(cache, prefix)

        def graph(tokens: Any = tokens, positions: Any = positions, chain: Any = chain) -> None:
            assert captured.verify(cache, visible, tokens, positions, chain, model.dtype) is not None
            kv.truncate(cache, prefix)

        row = {"eager_ms": round(timed(eager, 3 if args.dry_run else 20), 3)}
        t0 = time.perf_counter()
        timed(graph, 3)  # compiles (and captures) this bucket
        row["compile_s"] = round(time.perf_counter() - t0, 1)
        slowest = max(slowest, row["compile_s"])
        row["captured_ms"] = round(timed(graph, 3 if args.dry_run else 20), 3)
        results[str(n)] = row
        report.put("shape8b", "verify", results)
        report.log(f"shape8b: n={n}: eager {row['eager_ms']} ms, captured {row['captured_ms']} ms "
                   f"(compile {row['compile_s']} s)")  # fmt: skip
    return results


# ---- the embedded SmolLM2 ---------------------------------------------------------------------------
def section_smollm2(args: argparse.Namespace, report: Report) -> None:
    import torch

    from headstart.bench.questions import load_questions
    from headstart.heads.build import load_heads_for_inference
    from headstart.inference.decoder import SpeculativeDecoder
    from headstart.targets import load_target
    from headstart.tuned import tuned_tree

    # warm-ups cost: on an H200 (2026-11-26) 190 s for all eight methods, the captured ones
    # 28-43 s each (compiles), the eager ones 10-15 s: a call with less left times none of them
    # (--methods takes a subset, e.g. the eager ones and generate)
    need = 30 + sum(40 if "captured" in name or "compiled" in name else 15 for name in args.methods)
    if report.left() < need:
        report.log(f"smollm2: skipped (time: {report.left():.0f} s left, its warm-ups need ~{need} s)")
        return
    start = time.perf_counter()
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    report.put("smollm2", "dtype", dtype)
    target = load_target(args.target, dtype=dtype, device=args.device)
    report.log(f"smollm2: loaded {args.target} in {time.perf_counter() - start:.1f} s")
    shipped = ROOT / "headstart" / "default_heads"
    heads = {
        kind: load_heads_for_inference(shipped / f"smollm2-{kind}", target) for kind in ("medusa", "eagle3")
    }
    questions = load_questions(args.questions)[: args.num_questions + 1]  # the first one warms up
    prompts = [target.chat.user_prompt_ids(q.turns[0]) for q in questions]
    new = args.max_new_tokens
    eos = list(target.eos_token_ids)
    model = target.model

    def hf(static: bool) -> Any:
        def run(ids: list[int]) -> tuple[list[int], int]:
            x = torch.tensor([ids], device=target.device)
            extra = {"cache_implementation": "static"} if static else {}
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, do_sample=False,
                                 eos_token_id=eos, pad_token_id=eos[0], **extra)  # fmt: skip
            tokens = out[0, len(ids) :].tolist()
            return tokens, len(tokens)

        return run

    def ours(kind: str | None, compiled: bool, tree: str = "static", read_ahead: bool | None = None,
             program: bool = True, temperature: float = 0.0) -> Any:  # fmt: skip
        decoder = SpeculativeDecoder(target, heads.get(kind) if kind else None, tree=tree if kind else None,
                                     compile=compiled, compile_backend=args.backend)  # fmt: skip
        decoder.read_ahead = read_ahead  # None: reads ahead on CUDA (inference/engine.py)
        if not program:  # the round's steps one by one (before the round program): what it gains
            decoder.captured_round = None

        def run(ids: list[int]) -> tuple[list[int], int]:
            # sampled: seeded, so a method repeats (its tokens are not generate's greedy ones)
            out = decoder.generate([ids], max_new_tokens=new, do_sample=temperature > 0, temperature=temperature,
                                   seed=0 if temperature > 0 else None)  # fmt: skip
            tokens = out.token_ids[0]
            return tokens, out.stats.target_forwards

        return run

    methods = {"generate": hf(False), "generate_static_compiled": hf(True)}
    for kind in (None, "medusa", "eagle3"):
        for compiled in (False, True):
            methods[f"{kind or 'plain'}_{'captured' if compiled else 'eager'}"] = ours(kind, compiled)
    # plain captured reading each step at once (before read-ahead): what reading ahead gains
    methods["plain_captured_at_once"] = ours(None, True, read_ahead=False)
    for compiled in (False, True):  # the shipped heads' tuned tree, and EAGLE's reference tree
        mode = "captured" if compiled else "eager"
        if tuned_tree(shipped / "smollm2-eagle3"):
            methods[f"eagle3tuned_{mode}"] = ours("eagle3", compiled, tuned_tree(shipped / "smollm2-eagle3"))
        methods[f"eagle3ref_{mode}"] = ours("eagle3", compiled, EAGLE_REFERENCE_TREE)
    # the captured rounds as steps, without the one program (inference/captured_round.py)
    methods["eagle3_captured_steps"] = ours("eagle3", True, program=False)
    methods["eagle3ref_captured_steps"] = ours("eagle3", True, EAGLE_REFERENCE_TREE, program=False)
    # sampling at T = 0.7 (exact: the tokens are the target's distribution, not generate's greedy
    # ones, so `same_as_generate` reads 0): the program against its steps (both draw a static
    # tree's children from q), and plain captured sampling as their anchor
    methods["plain_captured_t07"] = ours(None, True, temperature=0.7)
    methods["eagle3_captured_t07"] = ours("eagle3", True, temperature=0.7)
    methods["eagle3_captured_steps_t07"] = ours("eagle3", True, program=False, temperature=0.7)
    methods["eagle3ref_captured_t07"] = ours("eagle3", True, EAGLE_REFERENCE_TREE, temperature=0.7)
    unknown = sorted(set(args.methods) - set(methods))
    if unknown:
        raise SystemExit(f"--methods: unknown {', '.join(unknown)}; known: {', '.join(methods)}")
    methods = {name: run for name, run in methods.items() if name in args.methods or name == "generate"}
    totals = {name: {"tokens": 0, "wall_s": 0.0, "forwards": 0, "same_as_generate": 0, "questions": 0,
                     "diverged_at": []} for name in methods}  # fmt: skip
    reserve = SERVE_NEEDS_S if "serve" in args.sections.split(",") else 0  # serve runs after this section
    reserve += 15 * len(methods) if args.profile else 0  # the profile runs after the timed questions
    for number, ids in enumerate(prompts):
        if number and report.left() < 30 + 2 * len(methods) + reserve:
            report.log(f"smollm2: stopped after {number - 1} timed questions (time)")
            break
        reference = None
        for name, run in methods.items():
            sync(args.device)
            t0 = time.perf_counter()
            tokens, forwards = run(ids)
            sync(args.device)
            wall = time.perf_counter() - t0
            if name == "generate":
                reference = tokens
            if number == 0:
                report.log(f"smollm2: warm-up {name}: {wall:.1f} s")
                continue
            row = totals[name]
            row["tokens"] += len(tokens)
            row["wall_s"] += wall
            row["forwards"] += forwards
            row["same_as_generate"] += int(tokens == reference)
            if tokens != reference:  # where it left generate's tokens (bf16 kernels round differently)
                row["diverged_at"].append(
                    next(
                        (i for i, (a, b) in enumerate(zip(tokens, reference, strict=False)) if a != b),
                        min(len(tokens), len(reference)),
                    )  # fmt: skip
                )
            row["questions"] += 1
        if number:
            summary = {}
            for name, row in totals.items():
                summary[name] = dict(row, tok_per_s=round(row["tokens"] / row["wall_s"], 1),
                                     ms_per_forward=round(1e3 * row["wall_s"] / max(row["forwards"], 1), 2),
                                     tau=round(row["tokens"] / max(row["forwards"], 1), 2))  # fmt: skip
            base = summary["generate"]["tok_per_s"]
            for row in summary.values():
                row["speedup_vs_generate"] = round(row["tok_per_s"] / base, 2)
            report.put("smollm2", "methods", summary)
            report.put("smollm2", "questions_timed", number)
            report.log(
                f"smollm2: question {number}: "
                + ", ".join(f"{k} {v['tok_per_s']}" for k, v in summary.items())
            )
    if args.profile and len(prompts) > 1:
        profile_methods(methods, prompts[1], args, report)


def profile_methods(
    methods: dict[str, Any], ids: list[int], args: argparse.Namespace, report: Report
) -> None:
    """One question of each method under torch.profiler (after its warm-up and timed runs, so no
    compile is in it): per method, the step's phases (the engine's `headstart.*` ranges) in ms per
    target forward, and the 25 costliest ops, into OUT/profile.txt; the phases into the report."""
    from torch.profiler import ProfilerActivity, profile

    cuda = args.device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    lines = []
    for name, run in methods.items():
        if name.startswith("generate"):
            continue
        sync(args.device)
        with profile(activities=activities) as prof:
            _, forwards = run(ids)
            sync(args.device)
        events = prof.key_averages()
        phases = {}
        for event in events:
            if event.key.startswith("headstart."):
                device_us = getattr(event, "device_time_total", getattr(event, "cuda_time_total", 0.0))
                phases[event.key.removeprefix("headstart.")] = {
                    "host_ms_per_forward": round(event.cpu_time_total / 1e3 / max(forwards, 1), 3),
                    "device_ms_per_forward": round(device_us / 1e3 / max(forwards, 1), 3),
                }
        report.put("profile", name, {"forwards": forwards, "phases": phases})
        report.log(
            f"profile {name}: " + ", ".join(f"{k} {v['host_ms_per_forward']} ms" for k, v in phases.items())
        )
        lines += [f"== {name}: {forwards} target forwards", json.dumps(phases, indent=1),
                  events.table(sort_by=sort, row_limit=25), ""]  # fmt: skip
        (args.out / "profile.txt").write_text("\n".join(lines))


# ---- headstart serve under load -----------------------------------------------------------------
SERVE_NEEDS_S = 150  # what the serve section needs left (smollm2 stops timing questions to leave it)


def section_serve(args: argparse.Namespace, report: Report) -> None:
    import signal
    import tarfile
    import tempfile

    limit = report.left() - 20
    if limit < SERVE_NEEDS_S - 20:  # two server start-ups (~15 s each on a GPU), warm-ups, 3 x 2 loads
        report.log(f"serve: skipped (time: {report.left():.0f} s left)")
        return
    requests, concurrency = (2, ["1", "2"]) if args.dry_run else (args.serve_requests, ["1", "4", "8"])
    # --compile off: the eager servers these figures compare with (auto compiles on CUDA since
    # 2026-12-04, and each new batch bucket's first requests would time its compile)
    served = f"--target {args.target} --device {args.device} --compile off"
    # the logs travel as one tarball: a call returns 8 files at most
    output, logs = report.out / "serve.json", Path(tempfile.mkdtemp(prefix="serve-logs-"))
    command = [sys.executable, str(ROOT / "scripts" / "bench_serve.py"), "--serve", served,
               "--serve", f"{served} --no-heads", "--questions", args.questions, "--requests", str(requests),
               "--concurrency", *concurrency, "--max-tokens", str(args.max_new_tokens),
               "--output", str(output), "--logs", str(logs)]  # fmt: skip
    report.log(f"serve: {' '.join(command)} (at most {limit:.0f} s)")
    # its own session: on a timeout the servers it started go too (they would hold the GPU)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)  # fmt: skip
    try:
        text, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text = f"{proc.communicate()[0]}\nTIMED OUT after {limit:.0f} s"
    (report.out / "serve.txt").write_text(text)
    rows = json.loads(output.read_text()) if output.exists() else []
    report.put("serve", "exit_code", proc.returncode)
    report.put("serve", "rows", rows)
    if any(logs.iterdir()):
        with tarfile.open(report.out / "serve-logs.tar.gz", "w:gz") as tar:
            tar.add(logs, arcname="serve-logs")
    for row in rows:
        report.log(f"serve: {row['server']} concurrency {row['concurrency']}: {row['tokens_per_s']} tok/s, "
                   f"{row['failed']} failed")  # fmt: skip
    if proc.returncode:
        report.log(f"serve: exit {proc.returncode}: {text.strip()[-1500:]}")


# ---- the loop at 8B shape: the replay drafter ------------------------------------------------------
REPLAY_TREES = ("chain:2", "chain:4", "dynamic:depth=5,top_k=10,total_tokens=60")


def section_replay8b(args: argparse.Namespace, report: Report) -> None:
    """The round in plain steps without trained heads (issue 68): the random-weight target of
    Llama-3.1-8B's shape (its output layer scaled x8: peaked logits, so greedy ties are rare),
    plain captured decoding against `--draft-model replay:accept=P` (the target's own greedy
    continuation, each draft wrong with probability 1 - P) at P 0.6 and 0.8 on chain 2, chain 4
    and EAGLE's 60-node tree; per configuration: tau, the round's ms and counts
    (inference/rounds.py), the round in plain steps, tokens/s over plain."""
    import types

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from headstart.inference.decoder import SpeculativeDecoder
    from headstart.inference.drafters.replay import Replay, ReplaySpec
    from headstart.inference.plain import SamplingConfig
    from headstart.inference.rounds import measure_rounds
    from headstart.targets.load import Target

    need = 60 + 40 * (1 + 2 * len(REPLAY_TREES))
    if report.left() < need and not args.dry_run:
        report.log(f"replay8b: skipped (time: {report.left():.0f} s left, ~{need} s needed)")
        return
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    shape = TINY if args.dry_run else LLAMA_8B
    torch.set_default_dtype(dtype)
    with torch.device(args.device):
        model = LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=False, attn_implementation="sdpa"))
    torch.set_default_dtype(torch.float32)
    model.eval().requires_grad_(False)
    model.get_output_embeddings().weight.mul_(8.0)
    stub = types.SimpleNamespace(pad_token_id=0, eos_token_id=None)  # ids in, ids out: no text
    target = Target(model=model, tokenizer=stub, chat=None, spec="random-llama-8b-shape", fingerprint={},
                    load_s=0.0, eos_token_ids=())  # fmt: skip
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens)
    prompt = torch.randint(
        0, shape["vocab_size"], (128,), generator=torch.Generator().manual_seed(0)
    ).tolist()
    compile = args.device == "cuda" or args.dry_run

    def build(heads: Any, tree: str | None) -> Any:
        return SpeculativeDecoder(target, heads, tree=tree, compile=compile, compile_backend=args.backend)

    plain = measure_rounds(build(None, None), prompt, sampling)
    report.put("replay8b", "plain_captured", plain)
    report.log(f"replay8b: plain step {plain and plain['ms']} ms")
    for accept in (0.6, 0.8):
        for tree in REPLAY_TREES:
            if report.left() < 45 and not args.dry_run:
                report.log("replay8b: stopped (time)")
                return
            replay = Replay(target, ReplaySpec(accept=accept, horizon=args.max_new_tokens + 16))
            decoder = build(replay, tree)
            out = decoder.generate([prompt], sampling=sampling, eos_token_id=None)
            figures = measure_rounds(decoder, prompt, sampling) or {}
            row = {"tau": round(out.stats.tau, 3), **figures}
            if plain and figures:
                row["round_in_plain_steps"] = round(figures["ms"] / plain["ms"], 3)
                row["over_plain"] = round(row["tau"] * plain["ms"] / figures["ms"], 3)
            report.put("replay8b", f"P{accept}_{tree}", row)
            report.log(f"replay8b: P {accept} {tree}: {row}")
    # the 8B-shape weights (16 GB in bf16) are freed when this returns: the caller's next section
    # allocates after it


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


SECTIONS = {
    "pytest": section_pytest,
    "shape8b": section_shape8b,
    "smollm2": section_smollm2,
    "replay8b": section_replay8b,
    "serve": section_serve,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")))
    parser.add_argument("--sections", default="pytest,shape8b,smollm2")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for the whole run")
    parser.add_argument("--target", default="smollm2", help="the SmolLM2 GGUF (the staged one on the device)")
    parser.add_argument("--questions", default=str(ROOT / ".gpu" / "questions.jsonl"))
    parser.add_argument("--num-questions", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument(
        "--dtype", choices=["bfloat16", "float32"], help="smollm2's weights (default: bf16 on CUDA)"
    )
    parser.add_argument("--serve-requests", type=int, default=32, help="serve's requests per concurrency")
    parser.add_argument(
        "--methods",
        type=lambda text: [m.strip() for m in text.split(",") if m.strip()],
        default="generate,generate_static_compiled,plain_eager,plain_captured,medusa_eager,medusa_captured,"
        "eagle3_eager,eagle3_captured",
        help="smollm2's methods, comma-separated (generate, the reference, always runs)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the timed questions, profile one question of each method (torch.profiler): where a "
        "step's time goes, by phase (headstart.draft/verify/accept/commit) and by op, into OUT/profile.txt",
    )
    parser.add_argument("--dry-run", action="store_true", help="the CPU, tiny shapes, 2 questions, 16 tokens")
    args = parser.parse_args()
    import torch

    args.device = "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda"
    if args.dry_run:
        args.num_questions, args.max_new_tokens = min(args.num_questions, 2), min(args.max_new_tokens, 16)
        args.backend = "aot_eager" if args.backend == "inductor" else args.backend
    report = Report(args.out, args.budget)
    machine(report, args.device)
    for name in args.sections.split(","):
        if name not in SECTIONS:
            parser.error(f"unknown section {name!r}: choose from {', '.join(SECTIONS)}")
        try:
            SECTIONS[name](args, report)
        except Exception as err:  # noqa: BLE001 - one section failing must not lose the others' figures
            import traceback

            report.put(name, "error", f"{type(err).__name__}: {err}")
            report.log(f"{name}: FAILED: {type(err).__name__}: {err}\n{traceback.format_exc()}")
    report.log(f"done, {report.budget - report.left():.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
