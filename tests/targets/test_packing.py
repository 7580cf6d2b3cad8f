"""MKL-packed linears for the verify forward: same numbers as F.linear, only inside the context."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from headstart.targets.packing import PackedLinears, mkl_packing_available, packed_rows
from headstart.targets.smallmm import small_matmul

pytestmark = pytest.mark.skipif(not mkl_packing_available(), reason="this PyTorch build has no MKL")


@pytest.fixture(autouse=True)
def mkl_packs_only(monkeypatch):
    """These tests are about MKL's packs: keep the small-row kernel (tests/targets/test_smallmm.py),
    which takes 1-64 rows first, out of the way."""
    monkeypatch.setenv("HEADSTART_SMALLMM", "0")
    small_matmul.cache_clear()
    yield
    small_matmul.cache_clear()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(48, 96), nn.GELU(), nn.Linear(96, 40, bias=False)).eval()


@pytest.mark.parametrize("rows", [4, 5, 8, 13])
def test_packed_equals_linear_and_is_removed_after(rows):
    model = _model()
    packer = PackedLinears.for_model(model)
    assert packer is not None
    x = torch.randn(1, rows, 48)
    with torch.no_grad():
        ref = model(x)
        with packer.rows(rows):
            assert all("forward" in m.__dict__ for m in packer.linears)
            out = model(x)
    # MKL's packed sgemm on the same fp32 numbers: only the summation order may differ
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert not any("forward" in m.__dict__ for m in packer.linears)
    assert packed_rows(rows) == {4: 4, 5: 8, 8: 8, 13: 16}[rows]


def test_other_row_counts_and_autograd_fall_back_to_linear():
    model = _model()
    packer = PackedLinears.for_model(model)
    x3 = torch.randn(3, 48, requires_grad=True)
    with packer.rows(8):
        y = model(torch.randn(2, 4, 48, requires_grad=True))  # 8 rows, but under autograd
        y.sum().backward()  # would fail in MKL's packed op, which has no backward
        with torch.no_grad():
            torch.testing.assert_close(model(x3), model[2](model[1](model[0](x3))), rtol=0, atol=0)
    assert model[0].weight.grad is not None


def test_weights_changed_in_place_are_repacked():
    model = _model()
    packer = PackedLinears.for_model(model)
    x = torch.randn(8, 48)
    with torch.no_grad():
        with packer.rows(8):
            before = model(x)
        model[2].weight.mul_(2.0)
        with packer.rows(8):
            after = model(x)
        torch.testing.assert_close(after, 2 * before, rtol=1e-5, atol=1e-5)


def test_keeps_at_most_keep_row_counts():
    model = _model()
    packer = PackedLinears.for_model(model)
    assert PackedLinears.for_model(model) is packer  # one packer per model, shared by its decoders
    packer.keep = 2
    with torch.no_grad():
        for rows in (4, 7, 14, 8):
            with packer.rows(rows):
                model(torch.randn(rows, 48))
    assert list(packer._packs) == [16, 8]


def test_not_used_off_fp32_or_when_disabled(monkeypatch):
    assert PackedLinears.for_model(_model().to(torch.bfloat16)) is None
    monkeypatch.setenv("HEADSTART_PACKED", "0")
    assert PackedLinears.for_model(_model()) is None


def test_keeping_raises_keep_inside_and_trims_after():
    model = _model()
    packer = PackedLinears.for_model(model)
    packer.keep = 2
    with torch.no_grad(), packer.keeping(3):
        for rows in (4, 8, 16):
            with packer.rows(rows):
                model(torch.randn(rows, 48))
        assert list(packer._packs) == [4, 8, 16]
    assert packer.keep == 2 and list(packer._packs) == [8, 16]
