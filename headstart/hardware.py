"""What a decode's speed depends on besides the code: the machine, named so that a tune or a
calibration measured on one machine is not trusted on another."""

from __future__ import annotations

import platform
from pathlib import Path

ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "sve", "asimd")
"""The instruction sets the CPU kernels (torch's, headstart's small-row kernel) use."""


def machine(device: str) -> str:
    """What a decode's speed depends on besides the code: the GPU's name, or the CPU model with the
    instruction sets the kernels use (the same model name can hide AMX or not on a VM)."""
    if device.startswith("cuda"):
        import torch

        return f"cuda:{torch.cuda.get_device_name()}"
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags = set(value.split())
            if model and flags:
                break
    except OSError:
        pass
    return f"cpu:{model} [{' '.join(f for f in ISA_FLAGS if f in flags)}]"
