"""The small-row kernel against PyTorch's matmul on a real target's weights, in one run.

    .venv/bin/python scripts/bench_smallmm.py                      # SmolLM2, rows 1-64, 1 and 2 threads

For each row count (a decode step's token, or a tree verify's nodes) and thread count, prints the
time of all the target's linear layers for one forward (every decoder layer's projections and
the lm_head, fp32): through `headstart/targets/smallmm.c` and through `F.linear` (MKL). Kernel and
MKL are timed interleaved, best of `--repeats`, so a noisy host moves both alike: compare the two
columns of one run. The kernel's calibration (which row counts decoding gives it) is not used
here: every row count is measured. MKL here is plain `F.linear`; past packing.MIN_ROWS rows the
decoder's alternative is MKL's packed gemm instead, which is what the calibration times against.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F


def weights(target_spec: str) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    from headstart.targets import load_target

    target = load_target(target_spec)
    return [
        (m.weight.detach().contiguous(), None if m.bias is None else m.bias.detach())
        for m in target.model.modules()
        if isinstance(m, torch.nn.Linear)
    ]


def best_ms(run: Callable[[], None], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--rows", default="1,2,4,8,16,32,64")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from headstart.targets.smallmm import small_matmul

    kernel = small_matmul()
    if kernel is None:
        print("the kernel did not build here (see the warning above): nothing to compare", file=sys.stderr)
        return 1
    layers = weights(args.target)
    megabytes = sum(w.numel() * 4 for w, _ in layers) / 1e6
    print(f"{len(layers)} linear layers, {megabytes:.0f} MB of fp32 weights; kernel: {kernel.path.name}")
    print("threads  rows   MKL ms  kernel ms  MKL/kernel")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for rows in (int(r) for r in args.rows.split(",")):
            inputs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w, _ in layers}

            def mkl(inputs: dict[int, torch.Tensor] = inputs) -> None:
                for w, b in layers:
                    F.linear(inputs[w.shape[1]], w, b)

            def ours(inputs: dict[int, torch.Tensor] = inputs) -> None:
                for w, b in layers:
                    kernel.linear(inputs[w.shape[1]], w, b)

            mkl_ms, ours_ms = float("inf"), float("inf")
            for _ in range(args.repeats):  # interleaved: host noise hits both sides
                mkl_ms = min(mkl_ms, best_ms(mkl, 1))
                ours_ms = min(ours_ms, best_ms(ours, 1))
            print(
                f"{threads:7d}  {rows:4d}  {mkl_ms:7.1f}  {ours_ms:9.1f}  {mkl_ms / ours_ms:10.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
