"""Load the frozen target from a Hub id, a local directory, a `.gguf` file or `smollm2`."""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headstart.errors import HeadstartError
from headstart.targets.chat import Chat
from headstart.targets.gguf import EMBEDDED_NAME, converted_dir, embedded_gguf_path, file_sha256

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
DTYPES = ("float32", "bfloat16", "float16", "auto")


@dataclass
class Target:
    """The frozen target: model (eval, no grad), tokenizer, chat helper and identity."""

    model: Any
    tokenizer: Any
    chat: Chat
    spec: str
    fingerprint: dict[str, Any]
    load_s: float
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> Any:
        return next(self.model.parameters()).dtype

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])


def resolve_spec(spec: str) -> tuple[str, Path | None]:
    """Classify `spec` as ('embedded'|'gguf'|'local'|'hub', path)."""
    if spec == EMBEDDED_NAME:
        return "embedded", embedded_gguf_path()
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise HeadstartError(f"GGUF file not found: {spec}", "check the path, or use --target smollm2")
        with path.open("rb") as handle:
            if handle.read(4) != b"GGUF":
                raise HeadstartError(
                    f"cannot read GGUF file {spec}: it does not start with the GGUF magic bytes "
                    f"({path.stat().st_size} bytes)",
                    "download the file again, or pass the model's directory or Hub id",
                )
        return "gguf", path
    if path.is_dir():
        if _holds_heads(path):
            raise HeadstartError(
                f"{spec} holds draft heads, not a target model",
                "pass it as --heads, and the model the heads draft for as --target",
            )
        if not (path / "config.json").is_file():
            raise HeadstartError(
                f"{spec} is a directory without config.json, not a transformers model",
                "point --target at a directory saved with save_pretrained, a .gguf file, a Hub id or smollm2",
            )
        if not any(any(path.glob(pattern)) for pattern in WEIGHT_FILES):
            raise HeadstartError(
                f"{spec} has a config.json but no weights (*.safetensors, *.bin)",
                "copy the model's weight files into it, or point --target at the full model directory",
            )
        return "local", path
    if path.exists():
        raise HeadstartError(
            f"{spec} is a file but not a .gguf model", "pass a model directory, a .gguf file or a Hub id"
        )
    if HUB_ID.match(spec) and not spec.startswith((".", "/", "~")):
        return "hub", None
    raise HeadstartError(
        f"unknown target '{spec}': not a local directory, a .gguf file, a Hub id (org/name) or 'smollm2'",
        "use --target smollm2 for the embedded model, or an existing path",
    )


def _holds_heads(path: Path) -> bool:
    """A heads directory (headstart's, or an export in an engine's format) given as a target."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict):
        return False
    architectures = " ".join(str(a) for a in config.get("architectures") or [])
    return (
        str(config.get("format", "")).startswith("headstart-heads")
        or "speculators_model_type" in config
        or "medusa_num_heads" in config
        or config.get("model_type") == "medusa"
        or "Eagle3" in architectures
        or "DFlashDraftModel" in architectures
    )


def _torch_dtype(dtype: str, device: str = "cpu") -> Any:
    """'auto': bfloat16 on CUDA (half the bytes per weight read: decoding at batch 1 is bound by
    memory bandwidth), float32 on CPU (the small-row kernels and MKL packs are fp32)."""
    import torch

    if dtype not in DTYPES:
        raise HeadstartError(f"unknown dtype '{dtype}'", f"use one of {', '.join(DTYPES)}")
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, dtype)


def _device(device: str) -> str:
    """'auto', 'cpu', 'cuda', 'cuda:N' (or 'mps' where PyTorch has it), checked against this
    machine before any load; anything else is one line listing the valid devices."""
    import torch

    valid = ["auto", "cpu", "cuda", "cuda:N"] + (["mps"] if torch.backends.mps.is_available() else [])
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda", "mps") or device.strip() != device:
        raise HeadstartError(f"unknown --device '{device}'", f"use one of {', '.join(valid)}")
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise HeadstartError(f"device '{device}' requested but CUDA is not available", "use --device cpu")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise HeadstartError(
                f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)",
                f"use cuda:0 .. cuda:{torch.cuda.device_count() - 1}",
            )
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise HeadstartError(f"device '{device}' requested but MPS is not available", "use --device cpu")
    return device


def _load_model(source: str, dtype: Any, revision: str | None, weights: bool = True) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(source, revision=revision)
    except OSError as err:
        raise HeadstartError(
            f"cannot load target '{source}': {str(err).splitlines()[0]}",
            "check the id/path and your network or HF_TOKEN",
        ) from None
    except ValueError as err:
        raise HeadstartError(
            f"transformers cannot read the config of '{source}': {str(err).splitlines()[0]}",
            "upgrade transformers or use a supported model",
        ) from None
    if not _is_causal_lm(config):
        raise HeadstartError(
            f"'{source}' ({type(config).__name__}) is not a causal language model",
            "choose a decoder model that AutoModelForCausalLM loads (Llama, Qwen2, Mistral, Gemma, ...)",
        )
    # sdpa/eager pass a custom 4D float mask through unchanged; FlashAttention-2 would not.
    # Families without sdpa (Gemma 2's soft-capping, gpt-oss's sinks) run eager: same masks.
    causal = AutoModelForCausalLM._model_mapping[type(config)]
    attention = "sdpa" if getattr(causal, "_supports_sdpa", True) else "eager"
    if not weights:  # shapes, config and generation config only: no memory, nothing to read
        import torch
        from transformers import GenerationConfig

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, attn_implementation=attention)
        try:
            model.generation_config = GenerationConfig.from_pretrained(source, revision=revision)
        except OSError:
            pass  # no generation_config.json: the model's defaults from its config
        return model
    return AutoModelForCausalLM.from_pretrained(
        source, revision=revision, dtype=dtype, attn_implementation=attention
    )


def _is_causal_lm(config: Any) -> bool:
    """A decoder-only causal LM: its config maps to a causal-LM class and, when the checkpoint
    names its architectures, one of them is that class (BERT maps to BertLMHeadModel but is saved
    as BertModel: an encoder, not a target)."""
    from transformers import AutoModelForCausalLM

    mapping = AutoModelForCausalLM._model_mapping
    if type(config) not in mapping or getattr(config, "is_encoder_decoder", False):
        return False
    causal = mapping[type(config)]
    names = {c.__name__ for c in (causal if isinstance(causal, tuple | list) else (causal,))}
    declared = getattr(config, "architectures", None) or []
    return not declared or any(name in names for name in declared)


def load_target(
    spec: str,
    dtype: str = "float32",
    device: str = "cpu",
    revision: str | None = None,
    chat_template: str | None = None,
    weights: bool = True,
) -> Target:
    """Load and freeze the target named by `spec`; see `resolve_spec` for the accepted forms.
    `chat_template`: a Jinja chat template, or a file holding one, replacing the tokenizer's
    (base models and many GGUF files have none). `weights=False`: config, tokenizer and identity
    only, the model on the meta device (for an API engine answering for a target too big to load)."""
    import logging

    from headstart.hardware import say_sharing

    template = read_chat_template(chat_template)  # before the load: a bad path fails in a second
    device = _device(device)  # likewise a device this machine lacks
    target = _load_somewhere(spec, dtype, device, revision, template, chat_template, weights)
    say_sharing(logging.getLogger("headstart"))  # loaded, the work begins: the threads a busy machine got
    return target


def _load_somewhere(spec: str, dtype: str, device: Any, revision: str | None, template: str | None,
                    chat_template: str | None, weights: bool) -> Target:  # fmt: skip
    """`_load` from a local path, or from the Hub (offline when it cannot be reached)."""
    from headstart.logs import libraries_to_stderr

    with libraries_to_stderr():  # a library's notice on stdout would break a command's --json
        if resolve_spec(spec)[0] != "hub":
            return _load(spec, dtype, device, revision, template, chat_template, weights)
        from headstart.targets.hub import hub_host, offline_unless_reachable

        with offline_unless_reachable() as online:
            try:
                return _load(spec, dtype, device, revision, template, chat_template, weights)
            except HeadstartError as err:
                if online:
                    raise
                raise HeadstartError(
                    f"cannot load target '{spec}': {hub_host()[0]} cannot be reached (no network?), and from "
                    f"the local Hub cache: {err.what.removeprefix(f'cannot load target {spec!r}: ')}",
                    "connect to the network, or copy the model into a folder and pass its path as --target",
                ) from None


def _load(
    spec: str, dtype: str, device: Any, revision: str | None, template: str | None, chat_template: str | None,
    weights: bool,
) -> Target:  # fmt: skip
    start = time.perf_counter()
    kind, path = resolve_spec(spec)
    source_hash = None
    if kind in ("embedded", "gguf"):
        assert path is not None
        source_hash = file_sha256(path)
        source = str(converted_dir(path, spec))
    else:
        source = str(path) if path else spec
    # a folder's tokenizer first: one without it fails in a second (a Hub id's model first: its
    # errors say whether the id exists)
    tokenizer = _load_tokenizer(source, revision, spec) if Path(source).is_dir() else None
    model = _load_model(source, _torch_dtype(dtype, device), revision, weights)
    if tokenizer is None:
        tokenizer = _load_tokenizer(source, revision, spec)
    if weights:
        model.to(device)
        if kind in ("embedded", "gguf"):  # CPU fp32 decoding reads the file's blocks (same bits)
            _attach_blocks(model, path, Path(source))
    model.eval().requires_grad_(False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if template is not None:
        tokenizer.chat_template = template
    check_chat_template(Chat(tokenizer), chat_template)
    target = Target(
        model=model,
        tokenizer=tokenizer,
        chat=Chat(tokenizer),
        spec=spec,
        fingerprint={},
        load_s=0.0,
        eos_token_ids=eos_token_ids(model, tokenizer),
    )
    if source_hash is None:  # the weights' identity, wherever they lie (a directory or the Hub cache)
        source_hash = weights_sha256(path if path else _hub_snapshot(spec, revision))
    target.fingerprint = fingerprint(target, kind, source_hash, revision)
    target.load_s = time.perf_counter() - start
    return target


def _load_tokenizer(source: str, revision: str | None, spec: str) -> Any:
    """The tokenizer beside the weights, or one line saying there is none (transformers says
    "Couldn't instantiate the backend tokenizer" in a traceback)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, revision=revision)
    except (OSError, ValueError, TypeError) as err:
        local = Path(source).is_dir()
        what = "its folder holds no tokenizer files" if local else "its tokenizer cannot be read"
        raise HeadstartError(
            f"cannot load target {spec!r}: {what} ({str(err).splitlines()[0][:160]})",
            "copy the model's tokenizer files (tokenizer.json, tokenizer_config.json, special_tokens_map.json) "
            "beside its weights"
            if local
            else "check the model id and its revision",
        ) from None


def _attach_blocks(model: Any, gguf_path: Path, converted: Path) -> None:
    """An optimisation: anything going wrong in it leaves the fp32 weights in charge, in one line."""
    import logging

    from headstart.targets.gguf_blocks import attach

    try:
        attach(model, gguf_path, converted)
    except Exception as err:  # noqa: BLE001 - gguf-py, safetensors and numpy raise their own types
        logging.getLogger(__name__).warning(
            "warning: decoding reads the fp32 weights, not the GGUF's blocks (%s: %s)",
            type(err).__name__,
            err,
        )


def read_chat_template(value: str | None) -> str | None:
    """A chat template given inline ('{%...') or as a path to a file holding one."""
    if value is None:
        return None
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise HeadstartError(
            f"chat template '{value}' is neither a Jinja template nor a file",
            "pass a file holding the template (e.g. chat_template.jinja) or the template text itself",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise HeadstartError(
            f"--chat-template {path} is not UTF-8 text (byte {err.object[err.start : err.start + 1].hex()} at {err.start})",
            "save the template as UTF-8",
        ) from None
    if "{{" not in text and "{%" not in text:
        raise HeadstartError(f"{path} holds no Jinja template", "pass the model's chat template file")
    return text


def check_chat_template(chat: Any, given: str | None) -> None:
    """Render a one-turn conversation through the template now: a template that does not compile
    or fails to render is one line at load time, not a traceback in the middle of a run."""
    if not chat.has_template:
        return
    where = f"--chat-template {given}" if given and "{" not in given else "the chat template"
    chat.render([{"role": "user", "content": "Hello"}], where=where)


def eos_token_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    """Every end-of-sequence id declared by the generation config or the tokenizer."""
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    for value in (getattr(gen, "eos_token_id", None), tokenizer.eos_token_id):
        if value is None:
            continue
        for item in value if isinstance(value, list | tuple) else [value]:
            if int(item) not in ids:
                ids.append(int(item))
    return tuple(ids)


def fingerprint(target: Target, kind: str, source_hash: str | None, revision: str | None) -> dict[str, Any]:
    """What identifies the target for data and heads: name, revision or file hash, shapes."""
    config = target.model.config
    commit = getattr(config, "_commit_hash", None) or (
        _hub_commit(target.spec, revision) if kind == "hub" else None
    )
    return {
        "name": target.spec if kind in ("embedded", "hub") else str(Path(target.spec).resolve()),
        "kind": kind,
        "revision": revision or commit,
        "sha256": source_hash,
        "architecture": (config.architectures or [type(target.model).__name__])[0],
        "model_type": config.model_type,
        "num_layers": target.num_layers,
        "hidden_size": target.hidden_size,
        "vocab_size": target.vocab_size,
    }


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth")


def weights_sha256(directory: Path | None) -> str | None:
    """sha256 over the weight files' names and contents, so the same weights match from any
    directory (a copy, another machine, the Hub cache). Cost: one read of the weights per new
    file (memoised by path, size and mtime, as for GGUF files)."""
    if directory is None:
        return None
    files = sorted({f for pattern in WEIGHT_FILES for f in directory.glob(pattern) if f.is_file()})
    if not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.name}:{file_sha256(file)}\n".encode())
    return digest.hexdigest()


def _hub_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The local snapshot directory a Hub load used (None when it cannot be found)."""
    from transformers.utils import cached_file

    try:
        return Path(cached_file(repo_id, "config.json", revision=revision)).parent
    except OSError:
        return None


def _hub_commit(repo_id: str, revision: str | None) -> str | None:
    """The snapshot commit a Hub load resolved to (huggingface_hub cache: .../snapshots/<commit>/)."""
    from transformers.utils import cached_file

    try:
        path = Path(cached_file(repo_id, "config.json", revision=revision))
    except OSError:
        return None
    return path.parent.name if path.parent.parent.name == "snapshots" else None


def fingerprint_mismatch(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Fields that differ between two fingerprints (shape fields and the weight identity). The
    name (a path or Hub id) only counts when the expected side records no weight hash."""
    keys = ("architecture", "num_layers", "hidden_size", "vocab_size", "sha256", "name")
    hashed = bool(expected.get("sha256"))  # records made before local weights were hashed have none
    return [
        k
        for k in keys
        if expected.get(k) != actual.get(k)
        and not (k == "name" and hashed)
        and not (k == "sha256" and not hashed)
    ]


def describe(fp: dict[str, Any]) -> str:
    return json.dumps({k: fp.get(k) for k in ("name", "architecture", "hidden_size", "vocab_size")})
