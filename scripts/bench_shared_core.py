"""How much slower `headstart generate` runs while another process keeps one core busy.

Each configuration (an environment for the command) runs the same `headstart generate` with the
shipped heads, once on an idle machine and once beside a single-thread busy loop, alternating which
comes first; every run is a whole process (start-up, load, decode), timed from outside, with the
decode's own tokens/s read from --json. The figures: median wall seconds idle and loaded and the
median of the paired ratios loaded/idle (the issue-67 goal: <= 1.5x).

    .venv/bin/python scripts/bench_shared_core.py --runs 3
    .venv/bin/python scripts/bench_shared_core.py --calibration     # the calibration's seconds, idle and loaded

Configurations: `auto` (headstart's own choice: headstart.hardware.share_machine), `spin` (torch's
default: every core, threads spin; HEADSTART_SHARE_MACHINE=0), `one` (OMP_NUM_THREADS=1), `passive`
(every core, OMP_WAIT_POLICY=PASSIVE). Nothing else may run meanwhile: the busy loop is the load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {
    "auto": {},
    "spin": {"HEADSTART_SHARE_MACHINE": "0"},
    "one": {"HEADSTART_SHARE_MACHINE": "0", "OMP_NUM_THREADS": "1"},
    "passive": {"HEADSTART_SHARE_MACHINE": "0", "OMP_WAIT_POLICY": "PASSIVE"},
}
PROMPT = "Write a short story about a dragon who learns to cook."
HEADSTART = str(Path(sys.executable).with_name("headstart"))


def run_once(env: dict[str, str], args: argparse.Namespace, cache: str) -> dict[str, float]:
    """One whole `headstart generate`: wall seconds, the decode's tokens/s, the calibration's seconds."""
    command = [HEADSTART, "generate", "--prompt", PROMPT, "--max-new-tokens", str(args.new_tokens), "--json",
               *args.extra]  # fmt: skip
    full = os.environ | env | {"HEADSTART_CALIBRATION_CACHE": cache}
    start = time.monotonic()
    done = subprocess.run(command, env=full, capture_output=True, text=True, timeout=args.timeout)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}")
    stats = json.loads(done.stdout.strip().splitlines()[-1])["stats"]
    kept = [json.loads(p.read_text()) for p in Path(cache).glob("*.json")]
    calibration = max((k.get("seconds", 0.0) for k in kept), default=0.0)
    return {"wall_s": wall, "tokens_per_s": stats["tokens_per_s"], "calibration_s": calibration}


def busy_loop() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def measure(
    name: str, env: dict[str, str], loaded: bool, args: argparse.Namespace, cache: str
) -> dict[str, float]:
    load = busy_loop() if loaded else None
    try:
        if load is not None:
            time.sleep(1.0)  # the loop running before the command starts, as a user's other job
        fresh = tempfile.mkdtemp(prefix="calibration-") if args.calibration else cache
        return run_once(env, args, fresh)
    finally:
        if load is not None:
            load.kill()
            load.wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--configs", default="auto,spin", help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--calibration", action="store_true",
                        help="a fresh calibration cache every run: time the calibration itself")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("extra", nargs="*", help="more generate arguments, after --")
    args = parser.parse_args()
    names = args.configs.split(",")
    caches = {name: tempfile.mkdtemp(prefix=f"calibration-{name}-") for name in names}
    if not args.calibration:  # warm-up: each configuration's calibration kept, idle and loaded
        for name in names:
            for loaded in (False, True):
                measure(name, CONFIGS[name], loaded, args, caches[name])
    rows: dict[str, dict[bool, list[dict[str, float]]]] = {n: {False: [], True: []} for n in names}
    for rep in range(args.runs):
        for name in names:
            for loaded in (False, True) if rep % 2 == 0 else (True, False):
                figures = measure(name, CONFIGS[name], loaded, args, caches[name])
                rows[name][loaded].append(figures)
                print(
                    f"run {rep} {name:8} {'loaded' if loaded else 'idle  '} {json.dumps(figures)}", flush=True
                )
    print(f"\n{'config':8} {'idle s':>7} {'loaded s':>8} {'ratio':>6} {'idle tok/s':>10} {'loaded tok/s':>12}"
          + ("  calibration s idle/loaded" if args.calibration else ""))  # fmt: skip
    for name in names:
        idle, loaded = rows[name][False], rows[name][True]
        ratio = statistics.median(b["wall_s"] / a["wall_s"] for a, b in zip(idle, loaded, strict=True))
        line = (f"{name:8} {statistics.median(r['wall_s'] for r in idle):7.2f} "
                f"{statistics.median(r['wall_s'] for r in loaded):8.2f} {ratio:6.2f} "
                f"{statistics.median(r['tokens_per_s'] for r in idle):10.2f} "
                f"{statistics.median(r['tokens_per_s'] for r in loaded):12.2f}")  # fmt: skip
        if args.calibration:
            line += (f"  {statistics.median(r['calibration_s'] for r in idle):.1f} / "
                     f"{statistics.median(r['calibration_s'] for r in loaded):.1f}")  # fmt: skip
        print(line)


if __name__ == "__main__":
    main()
