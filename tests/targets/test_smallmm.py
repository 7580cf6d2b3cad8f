"""The small-row CPU matmul kernel: F.linear's numbers, independent of row and thread count,
wired into the packing context, and a clean fallback when it cannot be built."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from headstart.targets import packing, smallmm
from headstart.targets.packing import PackedLinears
from headstart.targets.smallmm import MAX_ROWS, build, small_matmul

needs_kernel = pytest.mark.skipif(small_matmul() is None, reason="no C compiler: the kernel did not build")


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 11, 16, 37, 64])
@pytest.mark.parametrize("inner", [16, 40, 576])  # a whole number of vectors, a tail only, SmolLM2's
@pytest.mark.parametrize("outer", [1, 6, 193])  # under one 4-row block, a block and a tail, many blocks
def test_equals_linear(rows, inner, outer):
    torch.manual_seed(rows * 1000 + inner + outer)
    x, w, b = torch.randn(rows, inner), torch.randn(outer, inner), torch.randn(outer)
    kernel = small_matmul()
    for bias in (b, None):
        # fp32 sums in another order: judge both against float64, the kernel may not be less exact
        exact = F.linear(x.double(), w.double(), None if bias is None else bias.double())
        ours = (kernel.linear(x, w, bias).double() - exact).abs().max()
        torch_error = (F.linear(x, w, bias).double() - exact).abs().max()
        assert ours <= 2 * torch_error + 1e-6 * inner**0.5, (ours, torch_error)


@needs_kernel
@pytest.mark.parametrize("inner", [16, 200, 203])
def test_rows_do_not_change_each_others_bits(inner):
    """The property the tree verify relies on: row i's result is the same computed alone, with 7
    other rows or with all the others, at 1 thread or 2 (whole vectors only, and with a scalar
    tail; a compiler that fused the multiply-adds in one block shape and not another broke it)."""
    torch.manual_seed(0)
    x, w, b = torch.randn(MAX_ROWS, inner), torch.randn(301, inner), torch.randn(301)
    kernel = small_matmul()
    together = kernel.linear(x, w, b)
    alone = torch.cat([kernel.linear(x[i : i + 1], w, b) for i in range(MAX_ROWS)])
    eight = torch.cat([kernel.linear(x[i : i + 8], w, b) for i in range(0, MAX_ROWS, 8)])
    assert torch.equal(together, alone) and torch.equal(together, eight)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if before > 1 else 2)
        assert torch.equal(kernel.linear(x, w, b), together)
    finally:
        torch.set_num_threads(before)


@needs_kernel
def test_strided_rows_are_read_in_place():
    """A view with a row stride (a slice of a wider tensor) is taken as is, no copy needed."""
    torch.manual_seed(1)
    wide, w = torch.randn(4, 100), torch.randn(30, 64)
    x = wide[:, 10:74]
    assert small_matmul().fits(x, w, None) and not x.is_contiguous()
    torch.testing.assert_close(small_matmul().linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)


@needs_kernel
def test_inputs_it_does_not_take():
    kernel = small_matmul()
    w = torch.randn(8, 32)
    assert not kernel.fits(torch.randn(MAX_ROWS + 1, 32), w, None)
    assert not kernel.fits(torch.randn(2, 32, dtype=torch.float64), w.double(), None)
    assert not kernel.fits(torch.randn(32, 2).t(), w, None)  # columns not unit-stride
    assert not kernel.fits(torch.randn(2, 32), torch.randn(32, 8).t(), None)  # weight not contiguous


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(48, 96), nn.GELU(), nn.Linear(96, 40, bias=False)).eval()


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 8, 16])
def test_packing_context_uses_the_kernel(rows, monkeypatch):
    model = _model()
    packer = PackedLinears.for_model(model)
    calls = []
    kernel = small_matmul()
    real = kernel._fn
    monkeypatch.setattr(kernel, "_fn", lambda *a: calls.append((a[6], a[8])) or real(*a))  # (rows, K)
    x = torch.randn(1, rows, 48)
    with torch.no_grad():
        ref = model(x)
        with packer.rows(rows):
            out = model(x)
            model(torch.randn(rows + 1, 48))  # another row count: plain F.linear
    assert calls == [(rows, 48), (rows, 96)]
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert not any("forward" in m.__dict__ for m in packer.linears)


@needs_kernel
def test_bound_forwards_are_kept_until_a_weight_or_the_threads_change():
    """Binding every linear to the kernel is done once per row count, not per forward (it was a
    third of a SmolLM2 decode step), and redone when what it captured changes."""
    model = _model()
    packer = PackedLinears.for_model(model)
    x = torch.randn(2, 48)

    def bound() -> list:
        with torch.no_grad(), packer.rows(2):
            out = model(x)
            forwards = [m.__dict__["forward"] for m in packer.linears]
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)  # model(x) outside: F.linear
        return forwards

    first = bound()
    assert all(a is b for a, b in zip(first, bound(), strict=True))
    with torch.no_grad():
        model[0].weight.mul_(2.0)  # in place: the bound weights are stale
    second = bound()
    assert all(a is not b for a, b in zip(first, second, strict=True))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if before > 1 else 2)
        assert all(a is not b for a, b in zip(second, bound(), strict=True))
    finally:
        torch.set_num_threads(before)
    assert not any("forward" in m.__dict__ for m in packer.linears)
    model[0].bias.data = torch.full_like(model[0].bias, 100.0)  # new storage, same tensor object
    with torch.no_grad(), packer.rows(2):
        out = model(x)
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)


@needs_kernel
def test_a_context_inside_another_gives_the_outer_its_forwards_back():
    model = _model()
    packer = PackedLinears.for_model(model)
    with torch.no_grad(), packer.rows(2):
        outer = [m.__dict__["forward"] for m in packer.linears]
        with packer.rows(3):
            assert all(m.__dict__["forward"] is not f for m, f in zip(packer.linears, outer, strict=True))
        assert all(m.__dict__["forward"] is f for m, f in zip(packer.linears, outer, strict=True))
    assert not any("forward" in m.__dict__ for m in packer.linears)


@needs_kernel
def test_bound_linear_is_the_same_kernel_and_refuses_what_it_cannot_take():
    kernel = small_matmul()
    w, b = torch.randn(40, 48), torch.randn(40)
    x = torch.randn(2, 3, 48)  # 6 rows
    fast = kernel.bind(w, b, 6)
    out = fast(x)
    assert out.shape == (2, 3, 40) and torch.equal(out, kernel.linear(x.reshape(6, 48), w, b).view(2, 3, 40))
    assert fast(torch.randn(7, 48)) is None  # another row count
    assert fast(torch.randn(6, 48, dtype=torch.float64)) is None
    assert fast(torch.randn(48, 6).t()) is None  # not contiguous: the caller's general path
    assert kernel.bind(torch.randn(48, 40).t(), None, 6) is None  # weight not contiguous
    assert kernel.bind(w, b, MAX_ROWS + 1) is None


@needs_kernel
def test_strided_rows_take_the_general_kernel_path_with_the_same_bits():
    model = _model()
    packer = PackedLinears.for_model(model)
    x = torch.randn(4, 96)[:, :48]  # rows with a stride: no fast path, still the kernel
    with torch.no_grad(), packer.rows(4):
        strided = model(x)
        contiguous = model(x.contiguous())
    assert torch.equal(strided, contiguous)


def test_disabled_or_unbuildable_kernel_falls_back(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("HEADSTART_SMALLMM", "0")
    small_matmul.cache_clear()
    try:
        assert small_matmul() is None
        monkeypatch.delenv("HEADSTART_SMALLMM")
        small_matmul.cache_clear()
        monkeypatch.setattr(smallmm, "compiler", lambda: None)
        with caplog.at_level("WARNING"):
            assert small_matmul() is None
        assert "no C compiler" in caplog.text
        model = _model()
        packer = PackedLinears.for_model(model)
        x = torch.randn(2, 48)
        with torch.no_grad():
            ref = model(x)
            if packer is not None:  # MKL packing still there; 2 rows is below its range
                with packer.rows(2):
                    assert not any("forward" in m.__dict__ for m in packer.linears)
                    torch.testing.assert_close(model(x), ref, rtol=0, atol=0)
    finally:
        small_matmul.cache_clear()


def test_build_error_names_the_compiler_output(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setattr(smallmm, "FLAG_SETS", (("-O2",),))
    with pytest.raises(RuntimeError, match="did not build"):
        build(tmp_path)
    assert not list(tmp_path.glob("*.so"))  # nothing half-written left behind


@needs_kernel
def test_build_is_cached_per_source_and_cpu(tmp_path):
    first = build(tmp_path)
    assert first.exists() and build(tmp_path) == first
    assert first.name.startswith("smallmm-") and len(list(tmp_path.iterdir())) == 1


def test_for_model_needs_fp32_cpu_weights():
    assert PackedLinears.for_model(_model().double()) is None
    assert packing.PackedLinears.for_model(nn.Sequential(nn.GELU())) is None


@needs_kernel
def test_calibration_is_measured_once_per_machine_and_overridable(monkeypatch, tmp_path):
    kernel, record = small_matmul(), tmp_path / "k.rows.json"
    monkeypatch.delenv("HEADSTART_SMALLMM_ROWS")
    rows = smallmm.calibrated_rows(kernel, record)
    assert rows in (0, *smallmm.ROW_BUCKETS)
    assert json.loads(record.read_text()) == {"version": 2, "rows": {str(torch.get_num_threads()): rows}}

    def no_measuring(_kernel):
        raise AssertionError("measured again")

    monkeypatch.setattr(smallmm, "_measure_rows", no_measuring)
    assert smallmm.calibrated_rows(kernel, record) == rows  # read back, not measured
    monkeypatch.setenv("HEADSTART_SMALLMM_ROWS", "8")
    assert smallmm.calibrated_rows(kernel, record) == 8


@needs_kernel
def test_a_first_format_record_is_measured_again(monkeypatch, tmp_path):
    """Records of the first calibration (one loss under a busy machine could write 0 rows, which
    turned the kernel off for good) are not trusted: they are measured again and rewritten."""
    kernel, record = small_matmul(), tmp_path / "k.rows.json"
    monkeypatch.delenv("HEADSTART_SMALLMM_ROWS")
    threads = str(torch.get_num_threads())
    record.write_text(json.dumps({threads: 0}))
    monkeypatch.setattr(smallmm, "_measure_rows", lambda _kernel: 8)
    assert smallmm.calibrated_rows(kernel, record) == 8
    assert json.loads(record.read_text()) == {"version": 2, "rows": {threads: 8}}


@needs_kernel
@pytest.mark.skipif(not packing.mkl_packing_available(), reason="no MKL packing in this torch build")
def test_packing_context_leaves_rows_past_the_calibrated_range_to_mkl(monkeypatch):
    monkeypatch.setattr(small_matmul(), "max_rows", 2)
    packer = PackedLinears.for_model(_model())
    with torch.no_grad(), packer.rows(8):
        used = [m.forward.__qualname__ for m in packer.linears if "forward" in m.__dict__]
    assert used and all(name.startswith("_packed_forward") for name in used)
    with torch.no_grad(), packer.rows(2):
        used = [m.forward.__qualname__ for m in packer.linears if "forward" in m.__dict__]
    assert used and all(name.startswith("_small_forward") for name in used)


def _gguf_blocks(kind: int, outer: int, inner: int, seed: int):
    """Random weights quantised by gguf-py, repacked for the kernel, and gguf-py's own dequantised
    fp32 weight (the model's weight for a GGUF target)."""
    import gguf
    import numpy as np

    from headstart.targets.blocks import Q4_1, BlockWeight
    from headstart.targets.gguf_blocks import repack

    qtype = gguf.GGMLQuantizationType.Q4_1 if kind == Q4_1 else gguf.GGMLQuantizationType.Q8_0
    w = np.random.default_rng(seed).standard_normal((outer, inner)).astype(np.float32)
    raw = gguf.quants.quantize(w, qtype)
    qs, d, m, _ = repack(raw, kind, outer, inner)
    return BlockWeight(kind, qs, d, m, 0, 0), torch.from_numpy(gguf.quants.dequantize(raw, qtype).copy())


@needs_kernel
@pytest.mark.parametrize("kind", [0, 1], ids=["Q4_1", "Q8_0"])
@pytest.mark.parametrize("inner", [32, 576, 1536])
@pytest.mark.parametrize("outer", [1, 6, 193])
def test_gguf_blocks_give_the_dequantised_weights_bits(kind, inner, outer):
    """Reading a GGUF target's blocks is the fp32 kernel on gguf-py's dequantised weights, bit for
    bit, at every row count and thread count (so decoding stays exact, only faster)."""
    blocks, dense = _gguf_blocks(kind, outer, inner, seed=inner + outer + kind)
    kernel = small_matmul()
    torch.manual_seed(outer)
    x, b = torch.randn(MAX_ROWS, inner), torch.randn(outer)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for rows in (1, 2, 3, 5, 8, 11, 16, 37, 64):
                for bias in (b, None):
                    got = kernel.linear_blocks(x[:rows], blocks, bias)
                    assert torch.equal(got, kernel.linear(x[:rows], dense, bias)), (threads, rows)
    finally:
        torch.set_num_threads(before)


@needs_kernel
@pytest.mark.parametrize("inner", [7, 32, 100, 1728])
@pytest.mark.parametrize("outer", [1, 6, 193])
def test_bf16_rows_give_the_fp32_weights_bits(inner, outer):
    """bf16 rows of a weight whose values are all bf16 (a head shipped in bf16) are the fp32 kernel
    on that weight bit for bit, at every row and thread count, any K (a vector body and a tail),
    special values included (signed zeros, subnormals, infinities)."""
    from headstart.targets.blocks import BF16, BlockWeight, dequantise

    torch.manual_seed(inner * outer)
    dense = torch.randn(outer, inner)
    dense.view(-1)[:: max(2, inner // 3)] = torch.tensor(
        [-0.0, 1e-40, -1e-39, float("inf"), float("-inf")]
    ).repeat(dense.numel())[: dense.view(-1)[:: max(2, inner // 3)].numel()]
    dense = dense.bfloat16()
    blocks = BlockWeight(BF16, dense.view(torch.int16), torch.empty(0), None, 0, 0)
    dense = dense.float()
    assert torch.equal(dequantise(BF16, blocks.qs, blocks.d, None), dense)
    kernel = small_matmul()
    x, b = torch.randn(MAX_ROWS, inner), torch.randn(outer)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for rows in (1, 2, 3, 8, 11, 64):
                for bias in (b, None):
                    got = kernel.linear_blocks(x[:rows], blocks, bias)
                    want = kernel.linear(x[:rows], dense, bias)  # as bits: NaNs (inf - inf) included
                    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (threads, rows)
    finally:
        torch.set_num_threads(before)


@needs_kernel
def test_bound_linear_reads_blocks_up_to_their_calibrated_rows(monkeypatch):
    blocks, dense = _gguf_blocks(0, 40, 64, seed=3)
    kernel = small_matmul()
    monkeypatch.setattr(kernel, "block_rows", 2)
    calls = []
    real = kernel._blocks_fn
    monkeypatch.setattr(kernel, "_blocks_fn", lambda *a: calls.append(a[4]) or real(*a))
    x = torch.randn(4, 64)
    for rows in (1, 2, 4):
        fast = kernel.bind(dense, None, rows, blocks)
        assert torch.equal(fast(x[:rows]), kernel.linear(x[:rows], dense))
    assert len(calls) == 2  # 1 and 2 rows read the blocks, 4 the fp32 weight


def test_block_rows_are_measured_once_and_overridable(monkeypatch, tmp_path):
    kernel = small_matmul()
    if kernel is None:
        pytest.skip("no C compiler")
    monkeypatch.setattr(smallmm, "_measure_block_rows", lambda _k: 4)
    record = tmp_path / "k.blocks.json"
    assert smallmm.calibrated_block_rows(kernel, record) == min(4, kernel.max_rows)
    monkeypatch.setattr(smallmm, "_measure_block_rows", lambda _k: pytest.fail("measured twice"))
    assert smallmm.calibrated_block_rows(kernel, record) == min(4, kernel.max_rows)
    monkeypatch.setenv("HEADSTART_BLOCK_ROWS", "0")
    assert smallmm.calibrated_block_rows(kernel, record) == 0


@needs_kernel
def test_linear_takes_the_kernel_only_where_it_can(monkeypatch):
    """`smallmm.linear` (a matmul against a tensor that is no module's weight, e.g. Medusa's
    draft-vocabulary rows): the kernel's bits for fp32 CPU inputs of up to max_rows rows outside
    autograd; F.linear (with its gradient) for anything else."""
    from headstart.targets.smallmm import linear

    kernel = small_matmul()
    used = []
    real = kernel.linear
    monkeypatch.setattr(kernel, "linear", lambda *a: used.append(1) or real(*a))
    x, w = torch.randn(3, 1, 64), torch.randn(40, 64)
    with torch.no_grad():
        got = linear(x, w)
        assert used and torch.equal(got, real(x.reshape(3, 64), w).view(3, 1, 40))
        used.clear()
        linear(torch.randn(kernel.max_rows + 1, 64), w)  # too many rows
        linear(x.bfloat16(), w.bfloat16())  # not fp32
    assert not used
    x.requires_grad_(True)
    out = linear(x, w)
    assert not used and out.requires_grad
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w))
