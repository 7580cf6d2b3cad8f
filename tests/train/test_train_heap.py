"""The heap trim that keeps long CPU runs' RSS flat: glibc only, every `heap_trim_every` optimizer steps."""

from __future__ import annotations

import ctypes
import sys

import pytest
from test_train_loop import _cfg
from tiny_data import self_distilled

from headstart.train import heap, loop


def _rss_anon_kb() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon:"))


@pytest.mark.skipif(heap._libc() is None, reason="glibc only")
def test_trim_returns_freed_heap_pages_to_the_os():
    libc = heap._libc()
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    # 20k blocks of 60 KB: under glibc's mmap threshold, so they come from the heap; freeing every
    # block but the last leaves ~1.2 GB of free heap that glibc's own top trim cannot give back
    blocks = [libc.malloc(60 * 1024) for _ in range(20_000)]
    for block in blocks:
        ctypes.memset(block, 1, 60 * 1024)  # touch: resident
    for block in blocks[:-1]:
        libc.free(block)
    before = _rss_anon_kb()
    assert heap.trim_heap()
    after = _rss_anon_kb()
    libc.free(blocks[-1])
    assert before - after > 500_000, (before, after)


def test_trim_is_a_no_op_off_linux(monkeypatch):
    heap._libc.cache_clear()
    monkeypatch.setattr(sys, "platform", "darwin")
    try:
        assert heap._libc() is None
        assert heap.trim_heap() is False
    finally:
        heap._libc.cache_clear()


def test_the_cpu_loop_trims_every_heap_trim_every_optimizer_steps(tiny_llama, tmp_path, monkeypatch):
    from headstart.targets import load_target

    target = load_target(str(tiny_llama))
    calls = []
    monkeypatch.setattr(loop, "trim_heap", lambda: calls.append(1) or True)
    data = self_distilled(target, count=12)
    cfg = _cfg(target.spec, tmp_path, "head.kind=medusa", "head.num_heads=2", "max_steps=6",
               "grad_accum=2", "heap_trim_every=2", "eval_every=100", "save_every=0")  # fmt: skip
    loop.train(cfg, data=data, target=target)
    assert len(calls) == 3  # after optimizer steps 2, 4 and 6, not micro-batches


def test_heap_trim_every_rejects_negative_values():
    from headstart.config import load_config
    from headstart.errors import HeadstartError
    from headstart.train.config import TrainConfig

    with pytest.raises(HeadstartError, match="heap_trim_every must be >= 0"):
        load_config(TrainConfig, None, ["heap_trim_every=-1"])
