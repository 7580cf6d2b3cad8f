"""A small-row fp32 matmul for decoding on CPU: y = x @ w.T + b for 1 to `MAX_ROWS` (64) rows of x.

Why (measured on this project's 2-core AMD EPYC, AVX-512, torch 2.13 CPU wheel with MKL 2024.2):
a decode step multiplies a handful of rows by every weight of the target, so it should cost one
pass over the weights (538 MB for SmolLM2: ~20 ms at the ~25 GB/s one core streams). MKL's
small-row paths get nowhere near that here, and do not use a second thread at all. All of
SmolLM2's matmuls (210 layer weights + the lm_head), per forward:

    rows                          1      2      4      8     16     32     64
    MKL F.linear, 1 thread       46     73     64     72     94            ms
    this kernel,  1 thread       28     24     21     34     66            ms
    MKL F.linear, 2 threads      50     72     62     60     71     97    150 ms
    this kernel,  2 threads      18     18     18     19     34     72    137 ms

(1-8 rows cost one pass over the weights at ~25-29 GB/s; past 8 the kernel is compute-bound at
~65 GFLOPS per thread, and past ~80 rows MKL's large-matrix gemm wins.)

How: `smallmm.c` (GCC/Clang vector extensions, so -march=native makes it AVX-512, AVX2 or NEON)
is compiled on first use with the system C compiler into `$HEADSTART_CACHE/kernels/` (about a
second; keyed by the source, the compiler and the CPU, written atomically) and called through
ctypes (~2 us per call, ~0.5 ms per SmolLM2 forward). No compiler, a failed build, or
`HEADSTART_SMALLMM=0`: `small_matmul()` returns None and callers keep PyTorch's matmul (one
warning says why).

The table above is an AVX-512 machine. On AVX2 (16 registers of 8 floats) the C file builds
8-float vectors and 4 x 2 blocks instead (the 16-float 8 x 2 block spilled to the stack there and
ran 2-4x slower than MKL). The same project's AVX2 EPYC (znver3), all of SmolLM2's matmuls,
`scripts/bench_smallmm.py`, one run:

    rows                          1      2      4      8     16     32     64
    MKL F.linear, 1 thread       56    100    119    140    191    282    430 ms
    this kernel,  1 thread       47     51     60     97    195    364    636 ms
    MKL F.linear, 2 threads      58    100    102     91    100    125    178 ms
    this kernel,  2 threads      33     33     32     46     80    120    309 ms

Where the kernel wins still depends on the CPU, so on first use `calibrated_rows` times the kernel
against the path packing.py would take otherwise, per row bucket, and keeps the kernel for the row
counts where it is not slower (a contiguous range 1..R, cached per machine beside the library;
`HEADSTART_SMALLMM_ROWS=R` overrides). Decoders then take the kernel up to R rows and MKL's packs past it.

Exactness: each output element is the same chain of fused multiply-adds whatever the row count
(up to `MAX_ROWS`) and the thread count, so a tree verify's matmuls equal sequential decoding's
bit for bit (tests/targets/test_smallmm.py). Against MKL (transformers' `generate`) results differ
by summation order only (~1e-6 relative), as MKL's own 8-row and 1-row paths already do.
Inference only: there is no backward.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

MAX_ROWS = 64  # all of SmolLM2's matmuls, 2 threads: 137 ms against MKL's 150 at 64 rows, 219 vs 197 at 96
SOURCE = "smallmm.c"
FLAG_SETS = (  # tried in order: the first that builds is used
    ("-O3", "-march=native", "-ffp-contract=fast", "-fopenmp"),
    ("-O3", "-march=native", "-ffp-contract=fast"),  # no OpenMP (e.g. Apple clang): one thread
    ("-O3", "-ffp-contract=fast"),  # a compiler that does not know -march=native
)


class SmallMatmul:
    """The compiled kernel; `linear` is F.linear for 2D fp32 CPU inputs of at most `max_rows` rows
    (MAX_ROWS, or fewer where calibration found MKL faster on this CPU: see `calibrated_rows`)."""

    def __init__(self, library: Path, max_rows: int = MAX_ROWS) -> None:
        self.path = library
        self.max_rows = max_rows
        lib = ctypes.CDLL(str(library))
        self._fn = lib.headstart_small_matmul
        self._fn.restype = None
        pointer, long = ctypes.c_void_p, ctypes.c_long
        self._fn.argtypes = [pointer, long, pointer, pointer, pointer, long, long, long, long, ctypes.c_int]
        # the same product from a GGUF target's quantised blocks (targets/gguf_blocks.py), same bits
        self._blocks_fn = lib.headstart_small_matmul_blocks
        self._blocks_fn.restype = None
        self._blocks_fn.argtypes = [pointer, long, ctypes.c_int, pointer, pointer, pointer, pointer, pointer,
                                    long, long, long, long, ctypes.c_int]  # fmt: skip
        self.block_rows = max_rows  # up to this many rows the blocks are read (`calibrated_block_rows`)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x (M, K) fp32 with unit stride in K; weight (N, K) contiguous fp32; bias (N,) or None.
        Returns (M, N). The caller checks M <= MAX_ROWS, device and dtype (`fits`)."""
        rows, inner = x.shape
        out = torch.empty(rows, weight.shape[0], dtype=torch.float32)
        self._fn(
            x.data_ptr(), x.stride(0), weight.data_ptr(), 0 if bias is None else bias.data_ptr(),
            out.data_ptr(), out.stride(0), rows, weight.shape[0], inner, torch.get_num_threads(),
        )  # fmt: skip
        return out

    def linear_blocks(self, x: torch.Tensor, blocks: Any, bias: torch.Tensor | None = None) -> torch.Tensor:
        """`linear` with the weight read from its GGUF blocks (`gguf_blocks.BlockWeight`): equal to
        `linear` on the dequantised weight bit for bit. Same conditions on x and bias."""
        rows, inner = x.shape
        outer = blocks.qs.shape[0]
        out = torch.empty(rows, outer, dtype=torch.float32)
        self._blocks_fn(
            x.data_ptr(), x.stride(0), blocks.kind, blocks.qs.data_ptr(), blocks.d.data_ptr(),
            0 if blocks.m is None else blocks.m.data_ptr(), 0 if bias is None else bias.data_ptr(),
            out.data_ptr(), out.stride(0), rows, outer, inner, torch.get_num_threads(),
        )  # fmt: skip
        return out

    def bind(
        self, weight: torch.Tensor, bias: torch.Tensor | None, rows: int, blocks: Any = None
    ) -> Callable[[torch.Tensor], torch.Tensor | None] | None:
        """`linear` for one weight and row count with the weight's checks and pointers taken once:
        a forward makes ~200 such calls, and the general path's checks, reshapes and pointer reads
        cost ~11 us a call (~2.5 ms of a 40 ms SmolLM2 verify). The callable takes contiguous fp32
        CPU inputs (..., K) of `rows` rows and returns None for anything else (the caller then takes
        the general path); None when the weight does not fit. Same kernel, same bits. `blocks`: the
        weight's GGUF blocks, read instead of it up to `block_rows` rows (the same bits again)."""
        if not (1 <= rows <= self.max_rows and self.weight_fits(weight, bias)):
            return None
        threads = torch.get_num_threads()
        outer, inner = weight.shape
        w_ptr, b_ptr = weight.data_ptr(), 0 if bias is None else bias.data_ptr()
        size = rows * inner
        f32 = torch.float32
        if blocks is not None and rows <= self.block_rows:
            fn, kind, d, m = self._blocks_fn, blocks.kind, blocks.d.data_ptr(), blocks.m
            q, m = blocks.qs.data_ptr(), 0 if m is None else m.data_ptr()

            # `_held` keeps the blocks alive as long as this binding: the pointers above stay valid
            def call(
                x_ptr: int, ldx: int, _w: int, b: int, y: int, ldy: int, *sizes: int, _held: Any = blocks
            ) -> None:
                fn(x_ptr, ldx, kind, q, d, m, b, y, ldy, *sizes)
        else:
            call = self._fn

        def linear(x: torch.Tensor) -> torch.Tensor | None:
            if (
                x.dtype != f32
                or x.numel() != size
                or x.shape[-1] != inner
                or not x.is_cpu
                or not x.is_contiguous()
            ):
                return None
            out = torch.empty(x.shape[:-1] + (outer,), dtype=f32)
            call(x.data_ptr(), inner, w_ptr, b_ptr, out.data_ptr(), outer, rows, outer, inner, threads)
            return out

        return linear

    def fits(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
        """Inputs the kernel takes as they are (no copies): CPU fp32, x rows with unit stride,
        a contiguous weight (and bias)."""
        return (
            x.dim() == 2
            and x.shape[0] <= self.max_rows
            and x.dtype == torch.float32
            and x.device.type == "cpu"
            and x.stride(1) == 1
            and SmallMatmul.weight_fits(weight, bias)
        )

    @staticmethod
    def weight_fits(weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
        """A weight (and bias) the kernel reads in place: 2D contiguous fp32 on the CPU."""
        return (
            weight.dim() == 2
            and weight.dtype == torch.float32
            and weight.device.type == "cpu"
            and weight.is_contiguous()
            and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
        )


def compiler() -> str | None:
    """The C compiler: $CC, else the one Python was built with, else cc/gcc/clang on PATH."""
    candidates = [
        os.environ.get("CC"),
        (sysconfig.get_config_var("CC") or "").split(" ")[0],
        "cc",
        "gcc",
        "clang",
    ]
    for name in filter(None, candidates):
        found = shutil.which(name)
        if found:
            return found
    return None


def _cpu_signature() -> str:
    """What -march=native depends on: the machine and, on Linux, the CPU's model and flags."""
    parts = [platform.machine(), platform.processor()]
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        parts += [
            next((s for s in lines if s.startswith(k)), "") for k in ("model name", "flags", "Features")
        ]
    except OSError:
        pass
    return "\n".join(parts)


def _cache_dir() -> Path:
    from headstart.targets.gguf import cache_root

    return cache_root() / "kernels"


def build(cache_dir: Path | None = None) -> Path:
    """Compile the kernel (or find it already built) and return the shared library's path.
    Raises RuntimeError with the compiler's message when no flag set builds."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set $CC, or install gcc or clang)")
    source = resources.files("headstart.targets").joinpath(SOURCE).read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    where = cache_dir or _cache_dir()
    where.mkdir(parents=True, exist_ok=True)
    errors = []
    for flags in FLAG_SETS:
        key = hashlib.sha256(b"\0".join([source, version.encode(), " ".join(flags).encode(),
                                         _cpu_signature().encode()])).hexdigest()[:16]  # fmt: skip
        target = where / f"smallmm-{key}.so"
        if target.exists():
            return target
        with tempfile.TemporaryDirectory(dir=where) as tmp:
            src = Path(tmp) / SOURCE
            src.write_bytes(source)
            lib = Path(tmp) / "smallmm.so"
            result = subprocess.run(
                [cc, *flags, "-shared", "-fPIC", str(src), "-o", str(lib)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if result.returncode == 0:
                os.replace(lib, target)  # atomic: a reader never sees half a library
                return target
            errors.append(f"{' '.join(flags)}: {result.stderr.strip()[-300:]}")
    raise RuntimeError("the kernel did not build:\n" + "\n".join(errors))


@functools.cache
def small_matmul() -> SmallMatmul | None:
    """The kernel, built and loaded once per process; None when disabled or unavailable."""
    if os.environ.get("HEADSTART_SMALLMM", "1") == "0" or os.environ.get("HEADSTART_PACKED", "1") == "0":
        return None
    try:
        library = build()
        kernel = SmallMatmul(library)
    except (RuntimeError, OSError) as err:
        log.warning("headstart: small-row CPU matmul kernel unavailable, using PyTorch's (%s)", err)
        return None
    kernel.max_rows = calibrated_rows(kernel, library.with_suffix(".rows.json"))
    kernel.block_rows = calibrated_block_rows(kernel, library.with_suffix(".blocks.json"))
    return kernel


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight) through the kernel where it takes the inputs as they are (fp32 CPU,
    at most its `max_rows` rows, no autograd, not while torch.compile traces), else F.linear: for
    a matmul against a tensor that is no module's weight (Medusa's draft-vocabulary rows, which
    the packing of nn.Linear modules never sees)."""
    cpu_fp32 = x.device.type == "cpu" and x.dtype == torch.float32  # else no kernel is built (a GPU)
    eager = not (torch.is_grad_enabled() or torch.compiler.is_compiling())
    kernel = small_matmul() if cpu_fp32 and eager else None
    if kernel is not None and x.dim() >= 2:
        flat = x.reshape(-1, x.shape[-1])
        if flat.shape[0] <= kernel.max_rows and kernel.fits(flat, weight, None):
            return kernel.linear(flat, weight).view(*x.shape[:-1], weight.shape[0])
    return torch.nn.functional.linear(x, weight)


ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
RECORD_VERSION = 2


def calibrated_rows(kernel: SmallMatmul, record: Path) -> int:
    """The most rows for which the kernel is no slower than the alternative on this CPU.

    Measured once per machine (~2-4 s) and stored in `record` next to the library; the env var
    HEADSTART_SMALLMM_ROWS overrides. Two weight shapes of a decoder (an MLP projection and a
    draft lm_head) at torch's current thread count; a bucket counts as won when the kernel's best
    time is within 10% of the alternative's, and the range stops at the first bucket lost twice (a
    contiguous 1..R keeps a verify's rows and sequential decoding's on one path). The two sides
    are timed alternately, so a busy machine slows both alike. Records older than RECORD_VERSION
    are measured again: the first calibration timed one side after the other and stopped at one
    loss, and a 0 it stored under another job had turned the kernel off for good."""
    override = os.environ.get("HEADSTART_SMALLMM_ROWS")
    if override:
        if override.strip().isdigit() and int(override) <= MAX_ROWS:
            return int(override)
        log.warning(
            "warning: HEADSTART_SMALLMM_ROWS=%s is not a row count in 0..%d: ignored", override, MAX_ROWS
        )
    threads = str(torch.get_num_threads())
    try:
        saved = json.loads(record.read_text())
        if saved.get("version") != RECORD_VERSION:
            saved = {}
        if threads in saved.get("rows", {}):
            return int(saved["rows"][threads])
    except (OSError, ValueError, AttributeError):
        saved = {}
    rows = _measure_rows(kernel)
    saved = {"version": RECORD_VERSION, "rows": {**saved.get("rows", {}), threads: rows}}
    tmp = record.with_name(f".{record.name}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(saved))
        os.replace(tmp, record)  # atomic: two processes calibrating at once both leave a whole file
    except OSError:
        pass
    log.info("headstart: small-row kernel used up to %d rows at %s threads", rows, threads)
    return rows


def best_pair(mine: Callable[[], object], other: Callable[[], object], reps: int = 7) -> tuple[float, float]:
    """Best times of the two, timed alternately (a burst of load hits both, not one)."""
    import time

    mine(), other()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(reps):
        for fn, out in ((mine, times[0]), (other, times[1])):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return min(times[0]), min(times[1])


def _measure_rows(kernel: SmallMatmul) -> int:
    from headstart.targets.mkl import MIN_ROWS, mkl_packing_available, packed_rows

    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, 576, generator=generator) for n in (1536, 8192)]

    def kernel_wins(rows: int) -> bool:
        mine = other = 0.0
        for weight in weights:
            x = torch.randn(rows, weight.shape[1], generator=generator)
            if rows >= MIN_ROWS and mkl_packing_available():
                pad = packed_rows(rows)
                pack = torch.ops.mkl._mkl_reorder_linear_weight(weight, pad)
                xp = torch.cat([x, x.new_zeros(pad - rows, x.shape[1])])
                alternative = functools.partial(torch.ops.mkl._mkl_linear, xp, pack, weight, None, pad)
            else:
                alternative = functools.partial(torch.nn.functional.linear, x, weight)
            times = best_pair(functools.partial(kernel.linear, x, weight), alternative)
            mine, other = mine + times[0], other + times[1]
        return mine <= 1.1 * other

    won = 0
    with torch.no_grad():
        for rows in ROW_BUCKETS:
            if not kernel_wins(rows) and not kernel_wins(rows):  # a loss must repeat to count
                break
            won = rows
    return won


def calibrated_block_rows(kernel: SmallMatmul, record: Path) -> int:
    """The most rows (up to the kernel's own `max_rows`) for which reading GGUF blocks is no
    slower than reading fp32 weights on this CPU. Both give the same bits, so this is speed only:
    the blocks move a fifth of the memory but add the dequantising, which wins at few rows and ties
    or loses once the matmul is compute-bound (measured: AVX-512 wins to 8 rows and ties past
    them, AVX2 wins at 1-2 rows only).
    Measured once per machine and thread count (~1 s) into `record`; HEADSTART_BLOCK_ROWS overrides."""
    override = os.environ.get("HEADSTART_BLOCK_ROWS", "").strip()
    if override.isdigit():
        return min(int(override), kernel.max_rows)
    threads = str(torch.get_num_threads())
    try:
        saved = json.loads(record.read_text())
        if threads in saved:
            return min(int(saved[threads]), kernel.max_rows)
    except (OSError, ValueError, TypeError):
        saved = {}
    rows = _measure_block_rows(kernel)
    tmp = record.with_name(f".{record.name}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps({**saved, threads: rows}))
        os.replace(tmp, record)
    except OSError:
        pass
    log.info("headstart: GGUF blocks and bf16 rows read up to %d rows at %s threads", rows, threads)
    return min(rows, kernel.max_rows)


def _measure_block_rows(kernel: SmallMatmul) -> int:
    """Synthetic Q4_1 (MLP projections) and Q8_0 (a vocabulary) weights shaped as SmolLM2's, ~80 MB
    of them in fp32: more than a CPU's last-level cache, as a decoder's weights are (a weight that
    stays cached would favour the fp32 side)."""
    from headstart.targets.blocks import Q4_1, Q8_0, BlockWeight, dequantise

    generator = torch.Generator().manual_seed(0)
    weights = []
    for kind, rows, inner in [(Q4_1, 1536, 576)] * 12 + [(Q8_0, 8192, 576)] * 2:
        d = (torch.rand(rows, inner // 32, generator=generator) * 0.01).half().float()
        if kind == Q4_1:
            qs = torch.randint(0, 256, (rows, inner // 2), dtype=torch.uint8, generator=generator)
            m = (torch.rand(rows, inner // 32, generator=generator) * -0.05).half().float()
        else:
            qs = torch.randint(-128, 128, (rows, inner), dtype=torch.int8, generator=generator)
            m = None
        weights.append((BlockWeight(kind, qs, d, m, 0, 0), dequantise(kind, qs, d, m)))

    def every(x: torch.Tensor, blocks: bool) -> None:
        for block, dense in weights:
            kernel.linear_blocks(x, block) if blocks else kernel.linear(x, dense)

    won = 0
    with torch.no_grad():
        for rows in ROW_BUCKETS:
            if rows > kernel.max_rows:
                break
            x = torch.randn(rows, 576, generator=generator)
            blocks, dense = functools.partial(every, x, True), functools.partial(every, x, False)
            if all(
                mine > other for mine, other in (best_pair(blocks, dense, 5), best_pair(blocks, dense, 5))
            ):
                break  # a loss must repeat to count
            won = rows
    return won
