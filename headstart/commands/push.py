"""`headstart push`: publish trained heads (with their model card and tuned tree) to the Hub."""

from __future__ import annotations

import argparse
from pathlib import Path

from headstart.errors import HeadstartError

UPLOADED = ("config.json", "model.safetensors", "README.md", "tuned_tree.json")
"""What a heads directory publishes (and an export's own files); training checkpoints and logs stay local."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("heads", help="heads directory written by `headstart train` (e.g. runs/x/final)")
    parser.add_argument("repo_id", help="Hub model repo, e.g. your-org/smollm2-eagle3-heads")
    parser.add_argument("--private", action="store_true", help="create the repo as private")
    parser.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN or the saved login)")
    parser.add_argument("--message", default="Upload headstart draft heads", help="commit message")


def run(args: argparse.Namespace) -> int:
    from huggingface_hub import HfApi

    folder = Path(args.heads)
    fmt, files = checked_upload(folder)
    api = HfApi(token=args.token)
    try:
        api.create_repo(args.repo_id, private=args.private or None, exist_ok=True, repo_type="model")
        info = api.upload_folder(
            repo_id=args.repo_id,
            folder_path=str(folder),
            allow_patterns=files,
            # an earlier push's head files that this one lacks (another format's card, a tuned tree
            # of other heads) would otherwise stay and be read with the new heads
            delete_patterns=[name for name in head_files() if name not in files],
            commit_message=args.message,
            repo_type="model",
        )
    except Exception as err:  # the hub client raises many types; its message says which
        raise HeadstartError(
            f"cannot push to '{args.repo_id}': {str(err).splitlines()[0]}",
            "check the repo id, your network and HF_TOKEN (huggingface-cli login)",
        ) from None
    print(f"pushed {fmt} heads ({', '.join(files)}) -> {getattr(info, 'commit_url', info)}")
    return 0


def head_files() -> list[str]:
    """Every file name a heads directory of any format publishes."""
    from headstart.heads.formats import FORMATS, adapter

    return sorted(set(UPLOADED).union(*(adapter(fmt).FILES for fmt in FORMATS)))


def checked_upload(folder: Path) -> tuple[str, list[str]]:
    """(what it is, files to upload) of a heads directory: headstart's own (from `train`) or an
    export in an engine's format (`headstart export`), its config read and its weights' header
    checked, so damaged heads are refused here rather than published."""
    from safetensors import SafetensorError, safe_open

    from headstart.heads.formats import adapter, detect_format

    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        raise HeadstartError(
            f"{folder} is not a heads directory (needs config.json and model.safetensors)",
            "pass the `final` directory written by headstart train, or a `headstart export` directory",
        )
    fmt = detect_format(folder)
    label = f"{fmt} export of"
    if fmt == "headstart":
        from headstart.heads import HeadConfig

        label = HeadConfig.read(folder).kind  # every field checked
    try:
        with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
            names = list(handle.keys())
    except (SafetensorError, OSError) as err:
        raise HeadstartError(
            f"{folder}/model.safetensors is damaged ({err})", "re-save or re-export the heads before pushing"
        ) from None
    if not names:
        raise HeadstartError(f"{folder}/model.safetensors holds no tensor", "re-save or re-export the heads")
    wanted = set(UPLOADED) | set(adapter(fmt).FILES)
    return label, sorted(name for name in wanted if (folder / name).is_file())
