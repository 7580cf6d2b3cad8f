"""A GGUF target's linears keep the file's Q4_1/Q8_0 blocks (targets/gguf_blocks.py) for the CPU
decode kernel: found by name (llama's permuted q/k rows matched back), attached only where they
dequantise to exactly the weight, kept beside the converted model, and decoding reads them with
the very same bits as the fp32 weights."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from headstart.targets import gguf_blocks
from headstart.targets.packing import PackedLinears
from headstart.targets.smallmm import small_matmul
from tests.tiny import make_target_dir

Q4_1, Q8_0 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (rope halves interleaved)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.fixture(autouse=True)
def blocks_are_read(monkeypatch):
    """Whether blocks are read at all is the kernel's timed calibration on this machine (AVX2
    under load measured 0 rows, and kept that in the user's kernel cache: four tests failed on
    it); what these tests check does not depend on it, so they read blocks at every row count."""
    kernel = small_matmul()
    if kernel is not None:
        monkeypatch.setattr(kernel, "block_rows", kernel.max_rows)


@pytest.fixture
def quantised(tmp_path):
    """A tiny llama whose weights are its GGUF's blocks dequantised, and that GGUF file."""
    model = AutoModelForCausalLM.from_pretrained(
        make_target_dir(tmp_path, "llama"), dtype=torch.float32
    ).eval()
    cfg = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(tmp_path / "tiny.gguf"), "llama")
    with torch.no_grad():
        for qualified, module in model.named_modules():
            if not isinstance(module, nn.Linear):
                continue
            qtype = Q8_0 if qualified == "lm_head" else Q4_1
            raw = gguf.quants.quantize(module.weight.numpy(), qtype)
            module.weight.copy_(torch.from_numpy(gguf.quants.dequantize(raw, qtype)))
            stored = module.weight.numpy()
            if qualified.endswith(("q_proj", "k_proj")):
                heads = cfg.num_attention_heads if qualified.endswith("q_proj") else cfg.num_key_value_heads
                stored = _permute(stored, heads)
            name = names.get_name(f"{qualified}.weight", try_suffixes=(".weight",))
            writer.add_tensor(name, gguf.quants.quantize(stored, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, tmp_path / "tiny.gguf"


def _linears(model):
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def test_every_linear_keeps_its_blocks_and_they_are_kept_on_disk(quantised, tmp_path, monkeypatch):
    model, path = quantised
    kept = tmp_path / "converted"
    kept.mkdir()
    assert gguf_blocks.attach(model, path, kept) == len(_linears(model))
    assert all(gguf_blocks.blocks_for(m) is not None for m in _linears(model))
    assert (kept / gguf_blocks.CACHE_FILE).is_file()
    gguf_blocks._BLOCKS.clear()
    monkeypatch.setattr(gguf_blocks, "_from_gguf", lambda *a: pytest.fail("read the GGUF again"))
    assert gguf_blocks.attach(model, path, kept) == len(_linears(model))  # from the kept file


def test_a_weight_that_differs_from_its_blocks_keeps_the_fp32_path(quantised):
    model, path = quantised
    layer = model.model.layers[0].mlp.up_proj
    with torch.no_grad():
        layer.weight[0, 0] += 1e-3  # no longer what the file holds
    assert gguf_blocks.attach(model, path) == len(_linears(model)) - 1
    assert gguf_blocks.blocks_for(layer) is None
    down = model.model.layers[0].mlp.down_proj
    assert gguf_blocks.blocks_for(down) is not None
    with torch.no_grad():
        down.weight.mul_(1.0)  # changed in place: the blocks are stale
    assert gguf_blocks.blocks_for(down) is None


def test_off_switch_and_gpu_or_bf16_targets(quantised, monkeypatch):
    model, path = quantised
    monkeypatch.setenv("HEADSTART_GGUF_BLOCKS", "0")
    assert gguf_blocks.attach(model, path) == 0
    monkeypatch.delenv("HEADSTART_GGUF_BLOCKS")
    assert gguf_blocks.attach(model.to(torch.bfloat16), path) == 0


@pytest.mark.skipif(small_matmul() is None, reason="no C compiler: the kernel did not build")
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_decode_forwards_read_the_blocks_with_the_same_bits(quantised, rows, monkeypatch):
    model, path = quantised
    kernel = small_matmul()
    monkeypatch.setattr(kernel, "block_rows", kernel.max_rows)
    ids = torch.arange(3, 3 + rows)[None]
    packer = PackedLinears.for_model(model)
    with torch.no_grad(), packer.rows(rows):
        fp32 = model(ids).logits
    read = []
    real = kernel._blocks_fn
    monkeypatch.setattr(kernel, "_blocks_fn", lambda *a: read.append(1) or real(*a))
    assert gguf_blocks.attach(model, path) == len(_linears(model))
    with torch.no_grad(), packer.rows(rows):
        blocks = model(ids).logits
    assert len(read) == len(_linears(model))  # every linear read its blocks
    assert torch.equal(blocks, fp32)


def test_a_damaged_or_foreign_kept_file_is_read_again_from_the_gguf(quantised, tmp_path, caplog):
    model, path = quantised
    kept = tmp_path / "converted"
    kept.mkdir()
    (kept / gguf_blocks.CACHE_FILE).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")  # truncated
    assert gguf_blocks.attach(model, path, kept) == len(_linears(model))
    assert "ignoring the kept GGUF blocks" in caplog.text
    from safetensors.torch import load_file, save_file

    tensors = load_file(kept / gguf_blocks.CACHE_FILE)  # rewritten whole by the attach above
    save_file(tensors, kept / gguf_blocks.CACHE_FILE, metadata={"kinds": "{}"})  # no format: an old layout
    gguf_blocks.detach(model)
    assert gguf_blocks.attach(model, path, kept) == len(_linears(model))
    name = next(n for n in tensors if n.endswith(".d"))
    tensors[name] = tensors[name] * 2  # blocks that no longer give the weight
    kinds = {n.removesuffix(".qs"): 0 if "lm_head" not in n else 1 for n in tensors if n.endswith(".qs")}
    save_file(
        tensors,
        kept / gguf_blocks.CACHE_FILE,
        metadata={"format": gguf_blocks.FORMAT, "kinds": json.dumps(kinds)},
    )
    assert gguf_blocks._read_kept(kept / gguf_blocks.CACHE_FILE, dict(model.named_modules())) is None


def test_an_unwritable_directory_keeps_nothing_and_loads(quantised, tmp_path):
    model, path = quantised
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    assert gguf_blocks.attach(model, path, not_a_dir) == len(_linears(model))


def test_detach_and_a_failing_attach_leave_the_fp32_weights(quantised, monkeypatch, caplog):
    model, path = quantised
    gguf_blocks.attach(model, path)
    gguf_blocks.detach(model)
    assert all(gguf_blocks.blocks_for(m) is None for m in _linears(model))
    from headstart.targets import load

    monkeypatch.setattr(gguf_blocks, "attach", lambda *a: (_ for _ in ()).throw(KeyError("no tensor map")))
    load._attach_blocks(model, path, path.parent)  # a warning, not a failed load
    assert "reads the fp32 weights" in caplog.text


def _rounded_to_bf16(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.bfloat16().float())
    return model


@pytest.fixture
def calibrated_to_read_blocks(monkeypatch):
    """The kernel reads blocks at every row count, whatever this machine's calibration found."""
    if small_matmul() is None:
        pytest.skip("no C compiler: the kernel did not build")
    monkeypatch.setattr(small_matmul(), "block_rows", small_matmul().max_rows)


def test_bf16_rows_are_kept_only_for_weights_that_are_bf16(tmp_path, calibrated_to_read_blocks, monkeypatch):
    model = AutoModelForCausalLM.from_pretrained(make_target_dir(tmp_path)).eval()
    assert gguf_blocks.attach_bf16(model) == 0  # random fp32 weights: nothing is exactly bf16
    _rounded_to_bf16(model)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[1:, 0] += 1e-3  # bf16 in its first row only
    linears = [m for m in _linears(model) if m is not model.model.layers[0].mlp.up_proj]
    monkeypatch.setenv("HEADSTART_BF16_ROWS", "0")
    assert gguf_blocks.attach_bf16(model) == 0
    monkeypatch.delenv("HEADSTART_BF16_ROWS")
    assert gguf_blocks.attach_bf16(model) == len(linears)
    assert all(gguf_blocks.blocks_for(m).kind == gguf_blocks.BF16 for m in linears)
    assert gguf_blocks.blocks_for(model.model.layers[0].mlp.up_proj) is None
    assert gguf_blocks.attach_bf16(model) == 0  # already kept
    with torch.no_grad():
        linears[0].weight.add_(1e-3)  # changed in place: stale, back to fp32
    assert gguf_blocks.blocks_for(linears[0]) is None
    fresh = _rounded_to_bf16(AutoModelForCausalLM.from_pretrained(make_target_dir(tmp_path)))
    assert gguf_blocks.attach_bf16(fresh.to(torch.bfloat16)) == 0  # a bf16 model reads its own weights


def test_bf16_rows_are_shared_by_tied_linears_and_skip_linears_never_called(calibrated_to_read_blocks):
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.unused = nn.Linear(32, 8), nn.Linear(32, 8), nn.Linear(32, 8)
            self.b.weight = self.a.weight
            _rounded_to_bf16(self)

        def linears_not_called(self) -> list[nn.Module]:
            return [self.unused]

    model = Tied()
    assert gguf_blocks.attach_bf16(model) == 2
    assert gguf_blocks.blocks_for(model.a) is gguf_blocks.blocks_for(model.b)
    assert gguf_blocks.blocks_for(model.unused) is None


def test_bf16_values_is_a_bit_test_not_a_float_compare():
    """A subnormal bf16 cannot hold compares equal under flush-to-zero; the bit test says no."""
    odd = torch.tensor([1.0, 0.0]).view(torch.int32)
    odd[1] = 0x00012345
    assert not gguf_blocks._bf16_values(odd.view(torch.float32)[None])
    assert gguf_blocks._bf16_values(torch.tensor([[1.0, -0.0, float("inf"), 2.0**-130]]).bfloat16().float())


def test_a_target_stored_in_bf16_decodes_from_its_bf16_rows_with_generate_s_tokens(
    tmp_path, calibrated_to_read_blocks, monkeypatch
):
    """A checkpoint saved in bf16 and loaded as fp32 (what the Hub's checkpoints are on a CPU):
    once decoding starts every linear reads its bf16 rows, and greedy decoding still equals
    transformers' generate."""
    from headstart.inference.decoder import SpeculativeDecoder
    from headstart.targets import load_target

    model = _rounded_to_bf16(AutoModelForCausalLM.from_pretrained(make_target_dir(tmp_path)))
    source = tmp_path / "bf16-checkpoint"
    model.to(torch.bfloat16).save_pretrained(source)
    make_target_dir(tmp_path)  # the tokenizer beside it
    from tests.tiny import make_tokenizer

    make_tokenizer().save_pretrained(source)
    kernel = small_matmul()
    target = load_target(str(source))
    linears = _linears(target.model)
    assert not any(map(gguf_blocks.blocks_for, linears))  # training never holds them
    decoder = SpeculativeDecoder(target, None)
    assert all(gguf_blocks.blocks_for(m).kind == gguf_blocks.BF16 for m in linears)
    read = []
    real = kernel._blocks_fn
    monkeypatch.setattr(kernel, "_blocks_fn", lambda *a: read.append(a[2]) or real(*a))
    prompt = [5, 9, 14, 3, 22]
    got = decoder.generate(prompt, max_new_tokens=12).sequences
    assert read and set(read) == {gguf_blocks.BF16}
    with torch.no_grad():
        expected = target.model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    assert torch.equal(got, expected)
