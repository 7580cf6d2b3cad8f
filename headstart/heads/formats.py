"""Heads in the serving engines' formats, both ways: `export_heads` writes a loaded head as

- "speculators": vLLM's `speculators` EAGLE-3 format (config.json with speculators_model_type
  "eagle3" and a transformer_layer_config; weights `layers.0.*`, `fc`, `norm`, `lm_head`, `d2t`,
  `t2d`). vLLM serves the directory as it is.
- "eagle": the EAGLE-3 release's layout (weights `midlayer.*`; a LlamaForCausalLMEagle3 config.json
  with draft_vocab_size), which SGLang, SpecForge, the EAGLE repo and llama.cpp's converter read.
- "medusa": vLLM's Medusa layout (config model_type "medusa"; weights `blocks.K.layers.J.*`,
  `lm_heads.K.weight` or one `lm_head.weight`, `token_map` for a draft vocabulary).
- "headstart": headstart's own checkpoint at another dtype (how the shipped heads become bf16).

and `read_foreign` turns any of the three (or the Medusa repo's own `medusa_lm_head.*`) back into
a headstart head checked against the target. Conventions: d2t holds offsets (target id = i +
d2t[i]), t2d is a bool mask over the target vocabulary; aux-layer ids follow the engines (id i = the
input of decoder layer i), i.e. headstart's feature layer id + 1.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from headstart.errors import HeadstartError
from headstart.heads.config import FORMAT, HeadConfig

FORMATS = ("speculators", "eagle", "medusa", "headstart")
LAYER = "midlayer.layer."  # headstart's prefix of the reference layer's weights
# Flags every EAGLE-3 reader could default differently; headstart's reference layout is all False.
EAGLE3_FLAGS = {
    "norm_before_residual": False,
    "norm_before_fc": False,
    "fc_norm": False,
    "norm_output": False,
}
# Draft-layer model types each format's readers build (speculators: model_definitions.model_classes).
LAYER_TYPES = {"speculators": ("llama", "qwen3"), "eagle": ("llama",)}
CONFIG_JUNK = ("architectures", "transformers_version", "_name_or_path", "auto_map", "_commit_hash", "dtype")


# ----------------------------------------------------------------------------------------- export


def export_heads(
    head: Any, fmt: str, output: str | Path, *, dtype: str = "bfloat16", verifier: str | None = None
) -> Path:
    """Write `head` in format `fmt` to the directory `output` (atomically: a failure leaves
    nothing). Refuses what the format cannot express. Returns the directory."""
    from safetensors.torch import save_file

    from headstart.heads.checkpoint import atomic_dir
    from headstart.io import normal_permissions

    if fmt not in FORMATS:
        raise HeadstartError(f"unknown export format '{fmt}'", f"use one of {', '.join(FORMATS)}")
    cast = _dtype(dtype)
    if fmt == "headstart":  # headstart's own layout at another dtype (the shipped heads: bf16)
        from headstart.heads.checkpoint import write_checkpoint

        def write_own(tmp: Path) -> None:
            write_checkpoint(tmp, head.config, head.state_dict(), cast)
            for file in tmp.iterdir():
                normal_permissions(file)

        return atomic_dir(output, write_own)
    if fmt == "medusa":
        config, state = _medusa_export(head)
    else:
        config, state = _eagle3_export(head, fmt, verifier or default_verifier(head.config))
    config["torch_dtype"] = dtype
    state = {
        k: (v.to(cast) if v.is_floating_point() else v).detach().cpu().contiguous() for k, v in state.items()
    }

    def write(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for file in tmp.iterdir():
            normal_permissions(file)  # readable by the serving process, as files written without headstart

    return atomic_dir(output, write)


# The files each format's export writes: a directory holding only these (and in that format) is
# an earlier export, which a new export may replace without --overwrite.
EXPORT_FILES = {"headstart": {"config.json", "model.safetensors", "README.md"}}


def is_export(path: Path, fmt: str) -> bool:
    """`path` is an earlier `headstart export --format fmt`: nothing but that export's files."""
    names = {p.name for p in Path(path).iterdir()}
    if not names <= EXPORT_FILES.get(fmt, {"config.json", "model.safetensors"}):
        return False
    try:
        return detect_format(path) == fmt
    except HeadstartError:
        return False


def default_verifier(config: HeadConfig) -> str:
    """The target as a serving engine names it: the Hub id, else the path or name recorded."""
    from headstart.target.gguf import EMBEDDED_NAME

    name = str(config.target.get("name"))
    # the embedded GGUF is a Q4_1 quantisation of this model: serve it with the same weights
    return "HuggingFaceTB/SmolLM2-135M-Instruct" if name == EMBEDDED_NAME else name


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise HeadstartError(f"unknown dtype '{name}'", "use bfloat16, float16 or float32")
    return value


def _eagle3_export(head: Any, fmt: str, verifier: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    config: HeadConfig = head.config
    if config.kind != "eagle3" or config.layout != "reference":
        what = (
            f"an {config.kind} head"
            if config.kind != "eagle3"
            else "an EAGLE-3 head in headstart's fc layout"
        )
        raise HeadstartError(
            f"the {fmt} format holds EAGLE-3 heads in the reference layout, not {what}",
            "retrain with head.kind=eagle3 (head.layout=reference is the default), or use --format medusa for Medusa",
        )
    layer = layer_config(config)
    if layer["model_type"] not in LAYER_TYPES[fmt]:
        raise HeadstartError(
            f"{fmt} readers build {'/'.join(LAYER_TYPES[fmt])} draft layers, this head's is {layer['model_type']}",
            "export with --format speculators (llama, qwen3) or serve the head with headstart",
        )
    state = dict(head.state_dict())
    prefix = "layers.0." if fmt == "speculators" else "midlayer."
    state = {(prefix + k[len(LAYER) :] if k.startswith(LAYER) else k): v for k, v in state.items()}
    full_vocab = config.draft_vocab_size == config.vocab_size
    if fmt == "speculators" and full_vocab:  # speculators registers no maps without a draft vocabulary
        state = {k: v for k, v in state.items() if k not in ("d2t", "t2d")}
    aux = [i + 1 for i in config.feature_layers]  # engines: id i = the input of decoder layer i
    if fmt == "speculators":
        return _speculators_config(config, layer, aux, verifier), state
    eagle = {
        **layer,
        "architectures": ["LlamaForCausalLMEagle3"],
        "num_hidden_layers": 1,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.hidden_size,
        "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True},
        **EAGLE3_FLAGS,
    }
    return eagle, state


def _speculators_config(
    config: HeadConfig, layer: dict[str, Any], aux: list[int], verifier: str
) -> dict[str, Any]:
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.hidden_size,
        "eagle_aux_hidden_state_layer_ids": aux,
        "embed_requires_grad": False,
        **EAGLE3_FLAGS,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": 3,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "verifier": {"name_or_path": verifier, "architectures": [str(config.target.get("architecture"))]},
        },
    }


def layer_config(config: HeadConfig) -> dict[str, Any]:
    """The draft layer's transformers config as the engines read it: one layer, the target's vocabulary."""
    from headstart.heads.layer import one_layer_config

    data = one_layer_config(config.target_config).to_dict()
    for key in CONFIG_JUNK:
        data.pop(key, None)
    data.update(num_hidden_layers=1, vocab_size=config.vocab_size)
    data.pop("layer_types", None)
    return data


def _medusa_export(head: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    config: HeadConfig = head.config
    if config.kind != "medusa":
        raise HeadstartError(
            f"the medusa format holds Medusa heads, not {config.kind}", "use --format speculators or eagle"
        )
    state: dict[str, torch.Tensor] = {}
    for k, blocks in enumerate(head.heads):
        for j, block in enumerate(blocks):
            state[f"blocks.{k}.layers.{j}.weight"] = block.linear.weight
            state[f"blocks.{k}.layers.{j}.bias"] = block.linear.bias
    if head.lm_heads is not None:
        for k, proj in enumerate(head.lm_heads):
            state[f"lm_heads.{k}.weight"] = proj.weight
    else:  # the target's lm_head, which the heads share: vLLM loads it from the draft checkpoint
        state["lm_head.weight"] = head.projection(0).weight
    truncated = config.vocab_size
    if getattr(head, "has_draft_vocab", False):
        state["token_map"] = head.draft_ids()
        truncated = config.draft_vocab_size
    medusa = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "num_heads": config.num_heads,
        "num_hidden_layers": config.num_layers,
        "medusa_num_heads": config.num_heads,  # the Medusa repo's names for the same two numbers
        "medusa_num_layers": config.num_layers,
        "truncated_vocab_size": truncated,
        "original_lm_head": head.lm_heads is None,
        "medusa_fc_bias": True,
        "max_paths": 64,
        "topk": 10,
    }
    return medusa, state


# ----------------------------------------------------------------------------------------- import


def detect_format(path: str | Path) -> str:
    """'headstart', 'speculators', 'eagle' or 'medusa', from the directory's config.json."""
    config = read_json(Path(path) / "config.json")
    if config.get("format") == FORMAT:
        return "headstart"
    if config.get("speculators_model_type") == "eagle3":
        return "speculators"
    if "speculators_model_type" in config:
        raise HeadstartError(
            f"{path} is a speculators '{config['speculators_model_type']}' head",
            "headstart reads speculators eagle3 heads; convert or retrain",
        )
    if config.get("model_type") == "medusa" or "medusa_num_heads" in config:
        return "medusa"
    if "draft_vocab_size" in config or any("Eagle3" in a for a in config.get("architectures") or []):
        return "eagle"
    raise HeadstartError(
        f"{path}/config.json is not a head checkpoint headstart knows",
        "pass a headstart, speculators (eagle3), EAGLE-3 (LlamaForCausalLMEagle3) or Medusa head directory",
    )


def read_json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise HeadstartError(
            f"no head checkpoint at {file.parent} (config.json missing)",
            "pass a directory written by headstart train or export, or a published head",
        )
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise HeadstartError(
            f"{file} is not valid JSON ({err})", "restore or re-download the checkpoint"
        ) from None
    if not isinstance(data, dict):
        raise HeadstartError(f"{file} is not a JSON object", "restore or re-download the checkpoint")
    return data


def read_weights(
    directory: Path, names: tuple[str, ...] = ("model.safetensors", "pytorch_model.bin")
) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint: sharded or single safetensors, or a PyTorch file read with
    weights_only (no pickled code runs). A damaged file is one clear line, not a traceback."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = (
        sorted(directory.glob("model-*-of-*.safetensors"))
        or [directory / n for n in names if (directory / n).is_file()][:1]
    )
    if not files:
        raise HeadstartError(
            f"no weights in {directory} (looked for {', '.join(names)})", "re-download or re-save the heads"
        )
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            if file.suffix == ".safetensors":
                state.update(load_file(str(file)))
            else:
                state.update(torch.load(file, map_location="cpu", weights_only=True))
        except (SafetensorError, OSError, RuntimeError, EOFError, ValueError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise HeadstartError(
                f"cannot read {file}: {reason}",
                "the file is damaged or truncated: re-download or re-save the heads",
            ) from None
    return state


def read_foreign(path: str | Path, fmt: str, target: Any) -> Any:
    """A published head (format `fmt`) as a headstart head for `target`: checked against the
    target's shapes (one line naming the mismatch), bound, on its device."""
    directory = Path(path)
    config = read_json(directory / "config.json")
    try:
        if fmt == "medusa":
            head = _medusa_import(directory, config, target)
        else:
            head = _eagle3_import(directory, fmt, config, target)
    except (KeyError, TypeError, ValueError, AttributeError) as err:  # a field of the wrong shape
        raise HeadstartError(
            f"{directory}/config.json is not a valid {fmt} head config ({type(err).__name__}: {err})",
            "restore or re-download the checkpoint",
        ) from None
    head.to(target.device)
    head.bind(target.model)
    return head


def _mismatch(path: Path, what: str, head: Any, target: Any) -> None:
    if head != target:
        raise HeadstartError(
            f"{path} was made for a target with {what} {head}, this target has {target}",
            "load the target the head was trained for",
        )


def _eagle3_import(directory: Path, fmt: str, config: dict[str, Any], target: Any) -> Any:
    from headstart.heads.eagle import Eagle3Head

    layer = dict(config["transformer_layer_config"]) if fmt == "speculators" else dict(config)
    flags = {k: bool(config.get(k, False)) for k in EAGLE3_FLAGS}
    unsupported = [k for k, v in flags.items() if v]
    if unsupported:
        raise HeadstartError(
            f"{directory} sets {', '.join(unsupported)}: headstart runs the reference EAGLE-3 order only",
            "use a head trained without these options",
        )
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise HeadstartError(
            f"{directory} has {layer['num_hidden_layers']} draft layers",
            "headstart runs 1-layer EAGLE-3 heads",
        )
    hidden = int(layer.get("hidden_size", 0))
    _mismatch(directory, "hidden size", int(config.get("target_hidden_size") or hidden), target.hidden_size)
    _mismatch(directory, "draft hidden size", hidden, target.hidden_size)
    _mismatch(directory, "vocabulary", int(layer.get("vocab_size", 0)), target.vocab_size)
    aux = config.get("eagle_aux_hidden_state_layer_ids") or (config.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids"
    )
    count = target.num_layers
    aux = list(aux) if aux else [2, count // 2, count - 3]
    if any(not 1 <= int(i) <= count for i in aux):
        raise HeadstartError(
            f"{directory} taps target layers {aux}, this target has {count} layers",
            "load the target the head was trained for",
        )
    state = read_weights(directory)
    prefix = "layers.0." if fmt == "speculators" else "midlayer."
    state = {(LAYER + k[len(prefix) :] if k.startswith(prefix) else k): v for k, v in state.items()}
    state = {k: v for k, v in state.items() if not k.startswith("verifier_")}
    layer.setdefault("model_type", "llama")
    draft = int(config.get("draft_vocab_size") or target.vocab_size)
    head_config = HeadConfig(
        kind="eagle3",
        layout="reference",
        hidden_size=hidden,
        vocab_size=target.vocab_size,
        target=dict(target.fingerprint),
        target_config={k: v for k, v in layer.items() if k not in ("draft_vocab_size", "eagle_config")},
        feature_layers=[int(i) - 1 for i in aux],
        draft_vocab_size=draft,
        own_embeddings="embed_tokens.weight" in state,
        training={"imported_from": f"{directory} ({fmt})"},
    )
    head = Eagle3Head(head_config)
    if "d2t" not in state:  # full vocabulary: identity maps
        state["d2t"], state["t2d"] = head.d2t, head.t2d
    state["d2t"], state["t2d"] = state["d2t"].to(torch.long), state["t2d"].to(torch.bool)
    load_checked(head, state, directory)
    return head


MEDUSA_REPO = re.compile(r"^(?:medusa_heads?\.)?(\d+)\.(\d+)\.(?:linear\.)?(weight|bias)$")


def _medusa_import(directory: Path, config: dict[str, Any], target: Any) -> Any:
    from headstart.heads.medusa import MedusaHeads

    num_heads = int(config.get("num_heads") or config.get("medusa_num_heads") or 0)
    num_layers = int(config.get("num_hidden_layers") or config.get("medusa_num_layers") or 1)
    if num_heads < 1:
        raise HeadstartError(
            f"{directory}/config.json names no Medusa heads", "set num_heads or medusa_num_heads"
        )
    _mismatch(
        directory, "hidden size", int(config.get("hidden_size") or target.hidden_size), target.hidden_size
    )
    _mismatch(directory, "vocabulary", int(config.get("vocab_size") or target.vocab_size), target.vocab_size)
    raw = read_weights(
        directory,
        ("model.safetensors", "medusa_lm_head.safetensors", "pytorch_model.bin", "medusa_lm_head.pt"),
    )
    state = _medusa_names(raw, num_layers)
    lm = target.model.get_output_embeddings().weight.detach().cpu()
    if "lm_head.weight" in state:  # vLLM's original_lm_head: one projection for every head
        weight = state.pop("lm_head.weight")
        if weight.shape != lm.shape or not torch.equal(lm.to(weight.dtype), weight):  # not the target's own
            state.update({f"lm_heads.{k}.weight": weight for k in range(num_heads)})
    token_map = state.pop("token_map", None)
    head_config = HeadConfig(
        kind="medusa",
        hidden_size=target.hidden_size,
        vocab_size=target.vocab_size,
        target=dict(target.fingerprint),
        target_config=target.model.config.to_dict(),
        num_heads=num_heads,
        num_layers=num_layers,
        shared_lm_head=not any(k.startswith("lm_heads.") for k in state),
        draft_vocab_size=target.vocab_size if token_map is None else int(token_map.numel()),
        training={"imported_from": f"{directory} (medusa)"},
    )
    head = MedusaHeads(head_config)
    if token_map is not None:  # the maps are set from the token map, not read
        state["d2t"], state["t2d"] = head.d2t, head.t2d
    load_checked(head, state, directory)
    if token_map is not None:
        head.set_draft_vocab(token_map)
    return head


def _medusa_names(raw: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """vLLM's (blocks.K.layers.J, lm_heads.K) or the Medusa repo's (K.J.linear, K.<layers>) names
    as headstart's (heads.K.J.linear, lm_heads.K)."""
    state: dict[str, torch.Tensor] = {}
    for name, value in raw.items():
        name = name.removeprefix("medusa_heads.")
        vllm = re.match(r"^blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)$", name)
        repo = MEDUSA_REPO.match(name)
        if vllm:
            state[f"heads.{vllm[1]}.{vllm[2]}.linear.{vllm[3]}"] = value
        elif repo and int(repo[2]) == num_layers:  # the repo's per-head lm_head
            state[f"lm_heads.{repo[1]}.weight"] = value
        elif repo:
            state[f"heads.{repo[1]}.{repo[2]}.linear.{repo[3]}"] = value
        else:
            state[name] = value
    for key in [k for k in state if k.endswith(".linear.weight")]:  # vLLM's medusa_fc_bias=False
        state.setdefault(
            key[: -len("weight")] + "bias", torch.zeros(state[key].shape[0], dtype=state[key].dtype)
        )
    return state


def load_checked(head: Any, state: dict[str, torch.Tensor], directory: Path) -> None:
    own = head.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = [k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape)]
    if missing or unexpected or wrong:
        detail = "; ".join(
            part
            for part in (
                f"missing {missing[:3]}" if missing else "",
                f"unexpected {unexpected[:3]}" if unexpected else "",
                f"shape of {wrong[0]}: {tuple(state[wrong[0]].shape)} vs {tuple(own[wrong[0]].shape)}"
                if wrong
                else "",
            )
            if part
        )
        raise HeadstartError(
            f"{directory} does not match a {head.kind} head for this target ({detail})",
            "check the head was made for this target",
        )
    head.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})
