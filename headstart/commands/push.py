"""`headstart push`: publish trained heads (with their model card and tuned tree) to the Hub."""

from __future__ import annotations

import argparse
from pathlib import Path

from headstart.errors import HeadstartError

UPLOADED = ("config.json", "model.safetensors", "README.md", "tuned_tree.json")
"""What a heads directory publishes; training checkpoints and logs stay local."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("heads", help="heads directory written by `headstart train` (e.g. runs/x/final)")
    parser.add_argument("repo_id", help="Hub model repo, e.g. your-org/smollm2-eagle3-heads")
    parser.add_argument("--private", action="store_true", help="create the repo as private")
    parser.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN or the saved login)")
    parser.add_argument("--message", default="Upload headstart draft heads", help="commit message")


def run(args: argparse.Namespace) -> int:
    from huggingface_hub import HfApi

    from headstart.heads import HeadConfig

    folder = Path(args.heads)
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        raise HeadstartError(
            f"{folder} is not a heads directory (needs config.json and model.safetensors)",
            "pass the `final` directory written by headstart train",
        )
    config = HeadConfig.read(folder)  # refuses anything that is not a headstart heads config
    files = [name for name in UPLOADED if (folder / name).is_file()]
    api = HfApi(token=args.token)
    try:
        api.create_repo(args.repo_id, private=args.private or None, exist_ok=True, repo_type="model")
        info = api.upload_folder(
            repo_id=args.repo_id,
            folder_path=str(folder),
            allow_patterns=files,
            commit_message=args.message,
            repo_type="model",
        )
    except Exception as err:  # the hub client raises many types; its message says which
        raise HeadstartError(
            f"cannot push to '{args.repo_id}': {str(err).splitlines()[0]}",
            "check the repo id, your network and HF_TOKEN (huggingface-cli login)",
        ) from None
    print(f"pushed {config.kind} heads ({', '.join(files)}) -> {getattr(info, 'commit_url', info)}")
    return 0
