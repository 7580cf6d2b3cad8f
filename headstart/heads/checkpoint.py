"""Hugging Face layout for heads: config.json + model.safetensors + README.md (model card),
through huggingface_hub's ModelHubMixin and ModelCard.

Directories are written next to their destination and renamed into place, so a crash never
leaves a half-written checkpoint. Bound target modules (embeddings, shared lm_head) are not
registered submodules, so they are never saved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import ModelHubMixin

from headstart.errors import HeadstartError
from headstart.heads.config import HeadConfig
from headstart.io import atomic_dir
from headstart.target.load import describe, fingerprint_mismatch


def check_fits(config: HeadConfig, target: Any) -> None:
    """Refuse a head made for another target, naming both."""
    diff = fingerprint_mismatch(config.target, target.fingerprint)
    if diff:
        raise HeadstartError(
            f"{config.kind} head was trained for {describe(config.target)} but the target is "
            f"{describe(target.fingerprint)} (differs in {', '.join(diff)})",
            "load the target the head was trained for, or train heads for this target",
        )


def _hub_dataset(source: str) -> bool:
    """A Hub dataset id ("org/name"), not a local path or a description."""
    return source.count("/") == 1 and " " not in source and not Path(source).expanduser().exists()


def model_card(config: HeadConfig) -> Any:
    """The model card (huggingface_hub's ModelCard): metadata a Hub page indexes (base_model,
    datasets, metrics with their held-out values) and what the head is, for which target, on what
    data, how well it drafts."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    target = config.target.get("name", "unknown")
    train = dict(config.training)
    metrics = {k: v for k, v in (train.pop("metrics", {}) or {}).items() if isinstance(v, int | float)}
    sources = list(train.pop("datasets", []) or [])
    title = f"{config.kind} draft head for {target}"
    data = ModelCardData(
        library_name="headstart",
        base_model=target if config.target.get("kind") == "hub" else None,
        datasets=[d for d in sources if _hub_dataset(d)] or None,
        tags=["speculative-decoding", config.kind, "headstart"],
        metrics=sorted(metrics) or None,
        model_name=title,
        eval_results=[
            EvalResult(task_type="speculative-decoding", dataset_type="held-out-distilled-conversations",
                       dataset_name="held-out distilled conversations", metric_type=k, metric_value=v)
            for k, v in sorted(metrics.items())
        ] or None,
    )  # fmt: skip
    lines = [
        f"# {title}",
        "",
        "Draft head for lossless speculative decoding with [headstart](https://pypi.org/project/headstart/):",
        "outputs are exactly the target's; the head only proposes tokens for the target to verify.",
        "",
        f"- target: `{target}` ({config.target.get('architecture')}, hidden {config.hidden_size}, vocab {config.vocab_size})",
        f"- head: {config.kind}, heads {config.num_heads}, layers {config.num_layers}, "
        f"feature layers {list(config.feature_layers) or 'last hidden'}, draft vocab {config.draft_vocab_size}"
        + (
            f", block {config.block_size} (one forward drafts {config.block_size - 1} tokens), mask token "
            f"{config.mask_token_id}"
            if config.kind == "dflash"
            else ""
        ),  # fmt: skip
        f"- training data: {train.pop('data', 'not recorded')}",
        f"- prompt sources: {', '.join(sources) or 'not recorded'}",
        f"- training steps: {train.pop('steps', 'not recorded')}",
    ]
    lines += [f"- {key}: {value}" for key, value in sorted(train.items())]
    lines += ["", "## Held-out accuracy (measured by the trainer)", ""]
    if metrics:
        lines += ["| metric | value |", "|---|---|"]
        lines += [
            f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |"
            for k, v in sorted(metrics.items())
        ]
    else:
        lines.append("not measured")
    lines += ["", "Load with `headstart.heads.load_heads(path, target)`."]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n")


def write_checkpoint(directory: Path, config: HeadConfig, state: dict[str, Any], dtype: Any = None) -> None:
    """headstart's files for a head into `directory`: config.json, model.safetensors (floating
    tensors cast to `dtype` when given: bf16 halves a shipped head), README.md (the model card)."""
    from safetensors.torch import save_file

    state = {
        k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().cpu().contiguous()
        for k, v in state.items()
    }
    (directory / "config.json").write_text(config.to_json())
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    model_card(config).save(directory / "README.md")


class HeadCheckpoint(
    ModelHubMixin,
    library_name="headstart",
    tags=["speculative-decoding", "headstart"],
    repo_url="https://pypi.org/project/headstart/",
):
    """save_pretrained / from_pretrained / push_to_hub for nn.Module heads with a `config`:
    huggingface_hub's ModelHubMixin (its push_to_hub saves into a temporary folder and uploads it
    in one commit), with headstart's files (config.json, model.safetensors, README.md) written
    atomically and loading checked against the target."""

    config: HeadConfig
    layout = "fc"
    """HeadConfig.layout of the checkpoints this class reads."""

    def save_pretrained(self, path: str | Path, **kwargs: Any) -> Path:  # type: ignore[override]
        """Write the head to `path` (replaced atomically); kwargs as ModelHubMixin's."""
        return atomic_dir(path, lambda tmp: ModelHubMixin.save_pretrained(self, tmp, **kwargs))

    def _save_pretrained(self, save_directory: Path) -> None:
        write_checkpoint(save_directory, self.config, self.state_dict())  # type: ignore[attr-defined]

    def generate_model_card(self, *args: Any, **kwargs: Any) -> Any:
        return model_card(self.config)

    @classmethod
    def from_pretrained(cls, path: str | Path, target: Any = None) -> Any:
        """Load a head; with `target` (a headstart Target) also check its fingerprint and bind."""
        from headstart.heads.files import load_checked, read_weights

        config = HeadConfig.read(path)
        if (config.kind, config.layout) != (cls.kind, cls.layout):  # type: ignore[attr-defined]
            raise HeadstartError(
                f"{path} holds a {config.kind} head ({config.layout} layout), not {cls.kind} ({cls.layout})",  # type: ignore[attr-defined]
                "use headstart.heads.load_heads",
            )
        if target is not None:
            check_fits(config, target)
        head = cls(config)  # type: ignore[call-arg]
        load_checked(head, read_weights(Path(path), ("model.safetensors",)), Path(path))
        if target is not None:
            head.to(target.device)
            head.bind(target.model)
        return head
