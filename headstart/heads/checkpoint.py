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
from headstart.outputs import publish_dir
from headstart.targets.load import describe, fingerprint_mismatch


def check_fits(config: HeadConfig, target: Any) -> None:
    """Refuse a head made for another target, naming both."""
    diff = fingerprint_mismatch(config.target, target.fingerprint)
    if diff:
        raise HeadstartError(
            f"{config.kind} head was trained for {describe(config.target)} but the target is "
            f"{describe(target.fingerprint)} (differs in {', '.join(diff)})",
            "load the target the head was trained for, or train heads for this target",
        )


def _hub_repo(name: str | None) -> bool:
    """A Hub repo id ("org/name"), not a local path: what a card's base_model may hold."""
    import re

    return (
        bool(name)
        and re.fullmatch(r"[\w.-]+/[\w.-]+", name) is not None
        and not Path(name).expanduser().exists()
    )


def _hub_dataset(source: str) -> bool:
    """A Hub dataset id ("org/name"), not a local path or a description."""
    return source.count("/") == 1 and " " not in source and not Path(source).expanduser().exists()


METRIC_TYPES = {
    "top1": "accuracy",
    "top5": "top_5_accuracy",
    "accept_len_est": "mean_accepted_tokens",
    "loss": "loss",
}
"""headstart's metric keys (eval/top1/step0, ...) as the model-index metric types a Hub page reads."""


def card_metric(key: str, value: float) -> dict[str, Any]:
    """A model-index metric for a trainer's held-out figure: a standard type, a readable name."""
    parts = key.removeprefix("eval/").split("/")
    kind = METRIC_TYPES.get(parts[0], parts[0])
    where = parts[1] if len(parts) > 1 else ""
    if where.startswith("step") and where[4:].isdigit():  # EAGLE: unroll step k drafts depth k + 1
        where = f"draft depth {int(where[4:]) + 1}"
    elif where.startswith("head") and where[4:].isdigit():  # Medusa: head k drafts depth k + 1
        where = f"head {where[4:]}"
    depth = f" at {where}" if where else ""
    names = {"accuracy": "top-1 draft accuracy", "top_5_accuracy": "top-5 draft accuracy",
             "mean_accepted_tokens": "estimated tokens per target forward (tau)", "loss": "held-out loss"}  # fmt: skip
    return {"type": kind, "name": names.get(kind, key) + depth, "value": value}


def model_card(config: HeadConfig, fmt: str = "headstart", base_model: str | None = None) -> Any:
    """The model card (huggingface_hub's ModelCard) of a head written in format `fmt`: metadata a
    Hub page indexes (base_model: the target's Hub id where known, license, pipeline_tag, datasets,
    model-index metrics with standard types) and what the head is, for which target, on what data,
    how well it drafts. No local path: a target loaded from a folder is named by the folder."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    from headstart.targets.gguf import hub_id

    config = config.portable()
    target = config.target.get("name", "unknown")
    train = dict(config.training)
    metrics = {k: v for k, v in (train.pop("metrics", {}) or {}).items() if isinstance(v, int | float)}
    sources = list(train.pop("datasets", []) or [])
    title = f"{config.kind} draft head for {target}"
    own = f"{config.options.card()}, " if hasattr(config.options, "card") else ""  # the kind's own fields
    shown = [card_metric(k, v) for k, v in sorted(metrics.items())]
    data = ModelCardData(
        library_name={"headstart": "headstart", "transformers": "transformers"}.get(fmt),
        license="apache-2.0",
        pipeline_tag="text-generation",
        base_model=base_model if _hub_repo(base_model) else hub_id(config.target),
        datasets=[d for d in sources if _hub_dataset(d)] or None,
        tags=["speculative-decoding", config.kind, "headstart", *([fmt] if fmt != "headstart" else [])],
        metrics=sorted({m["type"] for m in shown}) or None,
        model_name=title,
        eval_results=[
            EvalResult(task_type="speculative-decoding", task_name="speculative decoding",
                       dataset_type="held-out-distilled-conversations", dataset_name="held-out distilled conversations",
                       metric_type=m["type"], metric_name=m["name"], metric_value=m["value"])
            for m in shown
        ] or None,
    )  # fmt: skip
    lines = [
        f"# {title}",
        "",
        "Draft head for lossless speculative decoding with [headstart](https://pypi.org/project/headstart/):",
        "outputs are exactly the target's; the head only proposes tokens for the target to verify.",
        "",
        f"- target: `{target}` ({config.target.get('architecture')}, hidden {config.hidden_size}, vocab {config.vocab_size})",
        f"- head: {config.kind}, {own}layers {config.num_layers}, "
        f"feature layers {list(config.feature_layers) or 'last hidden'}, draft vocab {config.draft_vocab_size}",
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
    lines += ["", "Draft with it: `headstart generate --draft-model DIR`, or any engine's draft-model speculation."
              if fmt == "transformers" else "Load with `headstart.heads.load_heads(path, target)`."]  # fmt: skip
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
    options: tuple[str, ...] = ("num_layers",)
    """The head.* keys only some layouts take (num_layers beyond 1, EAGLE-3's reference-layout
    keys) that this class takes; a recipe setting another away from its default is refused in one
    line naming the layouts that take it (HeadSpec._check_layout_options)."""

    relayout_from: dict[str, tuple[str, ...]] = {}
    """Layouts of the same kind it warm-starts from (init_from), each with the config fields that
    may then differ; such a class has `relayout(old, fresh, target, conversations)` (EAGLE-3's
    reference layout from its fc layout)."""
    draft_slots = 0
    """Positions one draft forward appends to the head's cache beyond the tree's nodes (DFlash:
    its block after the context); the decoder's preallocation counts them."""

    @classmethod
    def check_config(cls, config: HeadConfig) -> None:
        """A kind's own checks of a saved config (DFlash: its block and mask token); none here."""

    def save_pretrained(self, path: str | Path, **kwargs: Any) -> Path:  # type: ignore[override]
        """Write the head's files into `path` (each whole or not at all; other files in `path` stay,
        as transformers' save_pretrained leaves them; a tuned tree of earlier heads there goes,
        since it would be read with these); kwargs as ModelHubMixin's."""
        from headstart.heads.files import TUNED_FILE
        from headstart.outputs import refuse_protected

        refuse_protected(path, "the heads directory")
        save = lambda tmp: ModelHubMixin.save_pretrained(self, tmp, **kwargs)  # noqa: E731
        return publish_dir(path, save, stale=[TUNED_FILE])

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
