"""`--device auto` / `--dtype auto`: CUDA in bf16 where present, else CPU in fp32; explicit
choices still win; heads follow the target's device and dtype."""

from __future__ import annotations

import pytest
import torch

from headstart.cli import build_parser
from headstart.errors import HeadstartError
from headstart.targets import load_target
from headstart.targets.load import _device, _torch_dtype


def test_auto_dtype_is_bf16_on_cuda_and_fp32_on_cpu():
    assert _torch_dtype("auto", "cuda") == torch.bfloat16
    assert _torch_dtype("auto", "cuda:1") == torch.bfloat16
    assert _torch_dtype("auto", "cpu") == torch.float32
    assert _torch_dtype("float16", "cpu") == torch.float16  # explicit dtypes are kept
    with pytest.raises(HeadstartError, match="unknown dtype"):
        _torch_dtype("int8", "cpu")


def test_auto_device_picks_cuda_only_when_present():
    assert _device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(HeadstartError, match="CUDA is not available"):
            _device("cuda")


@pytest.mark.parametrize("command", ["generate", "bench", "chat"])
def test_cli_defaults_are_auto(command):
    parser = build_parser()
    extra = {"generate": ["--prompt", "hi"], "bench": ["--output", "x"]}.get(command, [])
    args, _ = parser.parse_known_args([command, *extra])
    assert args.device == "auto" and args.dtype == "auto"


def test_auto_target_and_heads_share_device_and_dtype(tiny_llama):
    from headstart.heads import HeadSpec, build_head

    target = load_target(str(tiny_llama), dtype="auto", device="auto")
    expected = (
        (torch.device("cuda", 0), torch.bfloat16)
        if torch.cuda.is_available()
        else (torch.device("cpu"), torch.float32)
    )
    assert (target.device, target.dtype) == expected
    heads = build_head(HeadSpec(kind="eagle3", draft_vocab_size=0), target)
    param = next(heads.parameters())
    assert (param.device, param.dtype) == expected
    explicit = load_target(str(tiny_llama), dtype="bfloat16", device="cpu")  # explicit still works
    assert explicit.dtype == torch.bfloat16 and explicit.device.type == "cpu"
