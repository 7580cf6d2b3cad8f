"""Where an EAGLE-3 training step's time goes, its train tokens/s, the FLOPs it counts per token,
and the utilisation against a matmul peak measured in the same run.

    .venv/bin/python scripts/profile_train.py --output docs/results/scaling/profile-train-cpu.json
    .venv/bin/python scripts/profile_train.py --variant fp32: --variant bf16:mixed_precision=bf16
    python3 scripts/profile_train.py --device cuda --records 4096 batch_size=64 mixed_precision=bf16

A run builds the trainer's own pieces from the recipe (default: experiments/smollm2-training-speed/train_smollm2_eagle3_profile.yaml,
plus `key=value` overrides, as `headstart train` takes them): target, data, head, Objective,
AdamW, accelerate's autocast, then times the steps `headstart train` runs (forward, backward,
clip, optimizer step) on the same fixed batches for every variant:
- throughput: `--rounds` x `--steps` plain steps per variant, the variants interleaved (A B A B),
  one device sync at the end of each round; train tokens = real (unpadded) tokens, as the trainer
  counts them. The best round is reported, and every round's figure.
- the profile: `--profile-steps` more steps with a device sync at every phase boundary and each
  phase's exclusive time (phases nest: `unroll` excludes its `masks`): collate (the data loader
  building the batch), target (the frozen target's forward or the cached features' copy), fuse,
  unroll (the draft layer over the TTT steps), masks, labels (the target's draft-vocabulary
  distribution), loss (draft logits and the soft CE), backward, clip, optimizer, and `other`
  (the step's remainder). Syncs inside the code show as host syncs per step (counted: calls of
  Tensor.item / tolist / __bool__ / __int__ / __float__ and torch.cuda.synchronize).
- FLOPs: torch.utils.flop_counter over one step, forward and backward: matmuls, linear layers
  and attention (SDPA) as torch counts them (2 per multiply-add); elementwise work (norms, softmax,
  the optimizer) is not counted. Per train token: that total over the step's real tokens.
- peak: a square matmul (`--peak-size`, fp32 and bf16) timed on the same device in the same run;
  utilisation = FLOPs per token x tokens/s / the peak of the dtype the step's matmuls run in
  (bf16 under mixed_precision=bf16 or dtype=bfloat16, else fp32).
The JSON (`--output`) holds every figure with the device's name, the date, the commit and the
command; paths in it are relative to the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import inspect
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RECIPE = "experiments/smollm2-training-speed/train_smollm2_eagle3_profile.yaml"
# (module, attribute, phase): what the profile wraps; an attribute this checkout lacks is skipped,
# so the script also profiles older commits (PYTHONPATH=<a worktree of them>)
PHASES = [
    ("headstart.train.objective", "Objective.features", "target"),
    ("headstart.heads.eagle", "Eagle3FcHead.fuse", "fuse"),
    ("headstart.train.objective", "unroll_scored", "unroll"),
    ("headstart.train.objective", "additive", "masks"),
    ("headstart.train.objective", "ttt_masks", "masks"),
    ("headstart.train.objective", "Objective.target_logits_at", "labels"),
    ("headstart.heads.eagle", "Eagle3FcHead.logits", "loss"),
    ("headstart.train.losses", "ttt_loss_at", "loss"),
    ("headstart.train.objective", "fused_ttt_loss", "loss"),
    # since the per-kind objectives (train/objectives/): EAGLE-3's step binds these by name
    ("headstart.train.objectives.eagle", "unroll_scored", "unroll"),
    ("headstart.train.objectives.eagle", "fused_ttt_loss", "loss"),
    # since EAGLE's training folder (train/objectives/eagle/): the unroll's masks and the unfused loss
    ("headstart.train.objectives.eagle.unroll", "additive", "masks"),
    ("headstart.train.objectives.eagle.unroll", "ttt_masks", "masks"),
    ("headstart.train.objectives.eagle.loss_terms", "ttt_loss_at", "loss"),
]
SYNC_METHODS = ("item", "tolist", "__bool__", "__int__", "__float__")


_SYNCHRONIZE = torch.cuda.synchronize  # the profile's own syncs: not counted as the step's


def device_sync(device: torch.device) -> None:
    if device.type == "cuda":
        _SYNCHRONIZE(device)


class Clock:
    """Exclusive time and FLOPs per phase over nested `phase()` calls, each boundary synced."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}
        self.flops: dict[str, float] = {}
        self.stack: list[list[Any]] = []  # [name, start, child seconds, start flops, child flops]
        self.counter: Any = None  # a FlopCounterMode while FLOPs are counted
        self.enabled = False

    def _flops(self) -> float:
        return float(self.counter.get_total_flops()) if self.counter is not None else 0.0

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        device_sync(self.device)
        self.stack.append([name, time.perf_counter(), 0.0, self._flops(), 0.0])
        try:
            yield
        finally:
            device_sync(self.device)
            _, start, child, flops0, child_flops = self.stack.pop()
            took, spent = time.perf_counter() - start, self._flops() - flops0
            self.seconds[name] = self.seconds.get(name, 0.0) + took - child
            self.flops[name] = self.flops.get(name, 0.0) + spent - child_flops
            if self.stack:
                self.stack[-1][2] += took
                self.stack[-1][4] += spent


def wrap_phases(clock: Clock) -> list[tuple[Any, str, Any]]:
    """Wrap PHASES' functions so that each call is timed as its phase; returns what to restore."""
    import importlib

    restore = []
    for module_name, attribute, name in PHASES:
        owner: Any = importlib.import_module(module_name)
        *path, leaf = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = owner.__dict__.get(leaf) if isinstance(owner, type) else getattr(owner, leaf, None)
        if original is None:
            continue

        def timed(*args: Any, _f: Callable = original, _name: str = name, **kwargs: Any) -> Any:
            with clock.phase(_name):
                return _f(*args, **kwargs)

        setattr(owner, leaf, timed)
        restore.append((owner, leaf, original))
    return restore


@contextlib.contextmanager
def counted_syncs() -> Iterator[list[int]]:
    """Count the calls that make the host wait for the device (see the module doc)."""
    count = [0]
    saved = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS}

    def counting(f: Callable) -> Callable:
        def inner(*args: Any, **kwargs: Any) -> Any:
            # not torch.optim's reads of its step counters: they stay on the host on every device
            if "torch/optim/" not in sys._getframe(1).f_code.co_filename:
                count[0] += 1
            return f(*args, **kwargs)

        return inner

    for name, f in saved.items():
        setattr(torch.Tensor, name, counting(f))
    synchronize = torch.cuda.synchronize
    torch.cuda.synchronize = counting(synchronize)
    try:
        yield count
    finally:
        for name, f in saved.items():
            setattr(torch.Tensor, name, f)
        torch.cuda.synchronize = synchronize


def matmul_peak(device: torch.device, dtype: torch.dtype, size: int, seconds: float = 2.0) -> float:
    """TFLOP/s of a size x size matmul in `dtype` on `device`, best of repeated timings."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    for _ in range(3):
        torch.mm(a, b)
    device_sync(device)
    best, spent = float("inf"), 0.0
    while spent < seconds:
        start = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b)
        device_sync(device)
        took = (time.perf_counter() - start) / 4
        best, spent = min(best, took), spent + 4 * took
    return 2 * size**3 / best / 1e12


class Variant:
    """One recipe (the base plus overrides): its objective, optimizer and accelerator, built once."""

    def __init__(self, label: str, overrides: list[str], base: list[str], recipe: str, target: Any, data: Any,
                 device: str) -> None:  # fmt: skip
        from headstart.config import load_config
        from headstart.train.config import TrainConfig
        from headstart.train.objective import Objective
        from headstart.train.setup import make_accelerator, make_head, make_optimizer, plan

        self.label, self.overrides = label, overrides
        out = Path(os.environ.get("TMPDIR", "/tmp")) / f"profile-train-{os.getpid()}-{label}"
        words = [*base, *overrides, f"output_dir={out}", "trackers=[none]", f"cpu={device == 'cpu'}"]
        self.cfg = load_config(TrainConfig, recipe, words)
        from accelerate.state import AcceleratorState

        # accelerate keeps one process-wide state: each variant's own mixed precision needs it reset
        # (a prepared model keeps the autocast it was wrapped in)
        AcceleratorState._reset_state(reset_partial_state=True)
        self.accelerator = make_accelerator(self.cfg)
        self.plan = plan(self.cfg, device=str(self.accelerator.device), data=data, target=target)
        head = make_head(self.plan)
        self.model = Objective(head, self.plan.target.model, self.cfg)
        params = [q for q in self.model.parameters() if q.requires_grad]
        self.optimizer, _ = make_optimizer(self.cfg, params)
        self.model, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)
        self.model.train()
        self.rates: list[float] = []
        self.data: list[dict[str, Any]] = []  # its batches (`batches`), and their collation time
        self.collate_s = 0.0

    def step(self, batch: dict[str, Any], clock: Clock) -> None:
        """One optimizer step as headstart.train.loop runs it (grad_accum 1)."""
        accelerator, cfg = self.accelerator, self.cfg
        with accelerator.accumulate(self.model):
            result = self.model(batch)
            with clock.phase("backward"):
                accelerator.backward(result["loss"])
            with clock.phase("clip"):
                if accelerator.sync_gradients and cfg.optim.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(self.model.parameters(), cfg.optim.max_grad_norm)
            with clock.phase("optimizer"):
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)


def batches(variant: Variant, count: int) -> tuple[list[dict[str, Any]], float]:
    """The first `count` batches of the trainer's own loader (length-grouped, seeded) on the
    device, and the seconds the loader took per batch (collation)."""
    import headstart.train.loop as loop
    from headstart.train.data import EpochSampler
    from headstart.train.loop import _loader

    p, cfg = variant.plan, variant.cfg
    # the trainer's own dataset (packed rows where data.pack says so); older commits index conversations
    dataset = loop._dataset(p, p.train_idx, train=True) if hasattr(loop, "_dataset") else p.train_idx
    if hasattr(dataset, "lengths"):
        lengths = dataset.lengths
    else:
        lengths = [min(len(p.data.input_ids[i]), cfg.data.max_length) for i in p.train_idx]
    sampler = EpochSampler(len(lengths), cfg.seed, lengths, cfg.batch_size, cfg.data.group_by_length)
    # train=True: the training loader's own collate (EAGLE-3's host-side plan); older commits lack it
    train = {"train": True} if "train" in inspect.signature(_loader).parameters else {}
    loader = iter(_loader(p, dataset, sampler, cfg.batch_size, drop_last=True, **train))
    out, start = [], time.perf_counter()
    for _ in range(count):
        out.append(next(loader))
    took = (time.perf_counter() - start) / count
    device = variant.accelerator.device
    moved = [{k: (v.to(device) if hasattr(v, "to") else v) for k, v in b.items()} for b in out]
    return moved, took


def tokens_of(batch: dict[str, Any]) -> int:
    return int(batch["lengths"].sum())


def throughput(variant: Variant, data: list[dict[str, Any]], steps: int, clock: Clock) -> float:
    """Train tokens/s over `steps` plain steps (one device sync at the end)."""
    device = variant.accelerator.device
    device_sync(device)
    start, tokens = time.perf_counter(), 0
    for i in range(steps):
        batch = data[i % len(data)]
        variant.step(batch, clock)
        tokens += tokens_of(batch)
    device_sync(device)
    return tokens / (time.perf_counter() - start)


def profile(variant: Variant, data: list[dict[str, Any]], steps: int, collate_s: float) -> dict[str, Any]:
    """Per-phase exclusive seconds per step (synced), host syncs per step, FLOPs per token."""
    from torch.utils.flop_counter import FlopCounterMode

    device = variant.accelerator.device
    clock = Clock(device)
    restore = wrap_phases(clock)
    try:
        clock.enabled = True
        total = 0.0
        with counted_syncs() as syncs:
            for i in range(steps):
                device_sync(device)
                start = time.perf_counter()
                with clock.phase("step"):
                    variant.step(data[i % len(data)], clock)
                total += time.perf_counter() - start
        seconds = {k: v / steps for k, v in clock.seconds.items()}
        seconds["other"] = seconds.pop("step")
        seconds["collate"] = collate_s  # the loader's time per batch (the trainer pays it in the loop)
        # FLOPs: one more step under the counter (no timing)
        clock.seconds, clock.flops = {}, {}
        with FlopCounterMode(display=False) as counter:
            clock.counter = counter
            with clock.phase("step"):
                variant.step(data[0], clock)
            clock.counter = None
        flops_total = float(counter.get_total_flops())
    finally:
        clock.enabled = False
        for owner, leaf, original in restore:
            setattr(owner, leaf, original)
    flops = {k: v for k, v in clock.flops.items() if v}
    flops["other"] = flops.pop("step", 0.0)
    tokens = tokens_of(data[0])
    return {
        "seconds_per_step": {k: round(v, 5) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])},
        "synced_step_s": round(total / steps + collate_s, 5),
        "host_syncs_per_step": syncs[0] / steps,
        "flops_per_token": flops_total / tokens,
        "flops_per_token_by_phase": {k: round(v / tokens) for k, v in flops.items() if v},
    }


def matmul_dtype(cfg: Any) -> str:
    return "bfloat16" if cfg.mixed_precision == "bf16" or cfg.dtype == "bfloat16" else "float32"


def commit() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {torch.get_num_threads()} threads"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="recipe overrides for every variant (key=value)")
    parser.add_argument("--recipe", default=DEFAULT_RECIPE)
    parser.add_argument("--variant", action="append", default=[],
                        help="LABEL:OVERRIDES (space-separated) compared in one sitting; default one, 'base:'")  # fmt: skip
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", type=int, default=4, help="distinct batches, cycled")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first")
    parser.add_argument("--steps", type=int, default=4, help="steps per variant per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile-steps", type=int, default=2)
    parser.add_argument("--peak-size", type=int, default=0, help="matmul size (default 2048 CPU, 8192 CUDA)")
    parser.add_argument("--output", type=Path, help="write the figures as JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    from headstart.config import load_config
    from headstart.train.config import TrainConfig
    from headstart.train.data import load_distilled_data
    from headstart.train.setup import plan

    device = torch.device(args.device)
    base_cfg = load_config(TrainConfig, args.recipe, [*args.overrides, "trackers=[none]"])
    shared = plan(base_cfg, device=str(device), data=load_distilled_data(base_cfg.data))
    specs = [v.partition(":") for v in args.variant] or [("base", ":", "")]
    variants = [Variant(label, shlex.split(words), list(args.overrides), args.recipe, shared.target,
                        shared.data, str(device)) for label, _, words in specs]  # fmt: skip
    # the same batches for every variant of one batch size (the same seed: the same order)
    made: dict[int, tuple[list[dict[str, Any]], float]] = {}
    for v in variants:
        v.data, v.collate_s = made.setdefault(v.cfg.batch_size, batches(v, args.batches))
    idle = Clock(device)
    for v in variants:
        for i in range(args.warmup):
            v.step(v.data[i % len(v.data)], idle)
    for _ in range(args.rounds):
        for v in variants:
            v.rates.append(throughput(v, v.data, args.steps, idle))
    size = args.peak_size or (8192 if device.type == "cuda" else 2048)
    peaks = {name: matmul_peak(device, getattr(torch, name), size) for name in ("float32", "bfloat16")}
    rows = []
    for v in variants:
        prof = profile(v, v.data, args.profile_steps, v.collate_s)
        rate = max(v.rates)
        dtype = matmul_dtype(v.cfg)
        achieved = prof["flops_per_token"] * rate / 1e12
        rows.append({
            "variant": v.label,
            "overrides": " ".join(v.overrides),
            "tokens_per_s": round(rate, 1),
            "tokens_per_s_rounds": [round(r, 1) for r in v.rates],
            "batch_size": v.cfg.batch_size,
            "matmul_dtype": dtype,
            "achieved_tflops": round(achieved, 4),
            "utilisation": round(achieved / peaks[dtype], 5),
            **prof,
        })  # fmt: skip
    data = variants[0].data
    result = {
        "tokens_per_s": rows[0]["tokens_per_s"],
        "device": device_name(device),
        "date": datetime.date.today().isoformat(),
        "commit": commit(),
        "command": "scripts/profile_train.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "torch": torch.__version__,
        "recipe": args.recipe,
        "batch": {
            "rows": variants[0].cfg.batch_size,
            "real_tokens": [tokens_of(b) for b in data],
            "padded_tokens": [int(b["input_ids"].numel()) for b in data],
        },  # fmt: skip
        "peak_tflops": {k: round(v, 3) for k, v in peaks.items()},
        "peak_matmul_size": size,
        "flops_counted_by": "torch.utils.flop_counter.FlopCounterMode over one step, forward and backward "
        "(matmuls, linears, SDPA; 2 FLOPs per multiply-add; elementwise work not counted), per real token",
        "variants": rows,
    }
    print_report(result)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2) + "\n")
    return result


def print_report(result: dict[str, Any]) -> None:
    print(f"{result['device']}; torch {result['torch']}; commit {result['commit']}; {result['date']}")
    print("peak matmul TFLOP/s: " + ", ".join(f"{k} {v}" for k, v in result["peak_tflops"].items()))
    for row in result["variants"]:
        rounds = " / ".join(str(r) for r in row["tokens_per_s_rounds"])
        print(f"\n== {row['variant']} ({row['overrides'] or 'the recipe'}): {row['tokens_per_s']} train tok/s "
              f"(rounds {rounds}); {row['flops_per_token'] / 1e9:.3f} GFLOP/token; "
              f"{row['achieved_tflops']} TFLOP/s = {100 * row['utilisation']:.2f}% of {row['matmul_dtype']} peak; "
              f"{row['host_syncs_per_step']:.0f} host syncs/step")  # fmt: skip
        total = sum(row["seconds_per_step"].values())
        for name, s in row["seconds_per_step"].items():
            gflop = row["flops_per_token_by_phase"].get(name, 0) / 1e9
            print(f"  {name:<10} {1000 * s:9.1f} ms  {100 * s / total:5.1f}%  {gflop:7.3f} GFLOP/token")


if __name__ == "__main__":
    main()
