"""Hugging Face layout for heads: config.json + model.safetensors + README.md (model card).

Directories are written next to their destination and renamed into place, so a crash never
leaves a half-written checkpoint. Bound target modules (embeddings, shared lm_head) are not
registered submodules, so they are never saved.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from headstart.errors import HeadstartError
from headstart.heads.config import HeadConfig
from headstart.io import normal_permissions
from headstart.target.load import describe, fingerprint_mismatch


def atomic_dir(dest: str | Path, write: Any) -> Path:
    """Call `write(tmp_dir)` then move tmp_dir to `dest`, replacing an old `dest` last."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        normal_permissions(tmp)
        write(tmp)
        old = None
        if dest.exists():
            old = dest.parent / f".{dest.name}.old-{os.getpid()}"
            os.replace(dest, old)
        os.replace(tmp, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def check_fits(config: HeadConfig, target: Any) -> None:
    """Refuse a head made for another target, naming both."""
    diff = fingerprint_mismatch(config.target, target.fingerprint)
    if diff:
        raise HeadstartError(
            f"{config.kind} head was trained for {describe(config.target)} but the target is "
            f"{describe(target.fingerprint)} (differs in {', '.join(diff)})",
            "load the target the head was trained for, or train heads for this target",
        )


def model_card(config: HeadConfig) -> str:
    """A README.md: what the head is, for which target, on what data, how well it drafts."""
    target = config.target.get("name", "unknown")
    train = dict(config.training)
    metrics = train.pop("metrics", {}) or {}
    lines = [
        "---",
        "library_name: headstart",
        f"base_model: {target}" if config.target.get("kind") == "hub" else f"# target: {target}",
        f"tags: [speculative-decoding, {config.kind}, headstart]",
        "---",
        "",
        f"# {config.kind} draft head for `{target}`",
        "",
        "Draft head for lossless speculative decoding with [headstart](https://pypi.org/project/headstart/):",
        "outputs are exactly the target's; the head only proposes tokens for the target to verify.",
        "",
        f"- target: `{target}` ({config.target.get('architecture')}, hidden {config.hidden_size}, vocab {config.vocab_size})",
        f"- head: {config.kind}, heads {config.num_heads}, layers {config.num_layers}, "
        f"feature layers {list(config.feature_layers) or 'last hidden'}, draft vocab {config.draft_vocab_size}",
        f"- training data: {train.pop('data', 'not recorded')}",
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
    return "\n".join(lines) + "\n"


class HeadCheckpoint:
    """save_pretrained / from_pretrained / push_to_hub for nn.Module heads with a `config`."""

    config: HeadConfig
    layout = "fc"
    """HeadConfig.layout of the checkpoints this class reads."""

    def save_pretrained(self, path: str | Path) -> Path:
        from safetensors.torch import save_file

        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}  # type: ignore[attr-defined]

        def write(tmp: Path) -> None:
            (tmp / "config.json").write_text(self.config.to_json())
            save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            (tmp / "README.md").write_text(model_card(self.config))

        return atomic_dir(path, write)

    @classmethod
    def from_pretrained(cls, path: str | Path, target: Any = None) -> Any:
        """Load a head; with `target` (a headstart Target) also check its fingerprint and bind."""
        from headstart.heads.formats import load_checked, read_weights

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

    def push_to_hub(
        self,
        repo_id: str,
        *,
        token: str | None = None,
        private: bool | None = None,
        commit_message: str = "Upload headstart draft head",
    ) -> str:
        """Upload config.json, weights and model card to a Hub model repo; returns the commit URL."""
        from huggingface_hub import HfApi

        api = HfApi(token=token)
        with tempfile.TemporaryDirectory() as tmp:
            folder = self.save_pretrained(Path(tmp) / "head")
            api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            info = api.upload_folder(
                repo_id=repo_id, folder_path=str(folder), commit_message=commit_message, repo_type="model"
            )
        return str(getattr(info, "commit_url", info))
