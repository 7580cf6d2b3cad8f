"""`headstart push`: publish trained heads (with their model card and tuned tree) to the Hub
(headstart/heads/push.py stages and uploads)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("heads", help="heads directory written by `headstart train` (e.g. runs/x/final)")
    parser.add_argument("repo_id", nargs="?", default=None,
                        help="Hub model repo, e.g. your-org/smollm2-eagle3-heads (not with --dry-run)")  # fmt: skip
    parser.add_argument("--private", action="store_true", help="create the repo as private")
    parser.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN or the saved login)")
    parser.add_argument("--message", default="Upload headstart draft heads", help="commit message")
    parser.add_argument("--dry-run", metavar="DIR", default=None,
                        help="write exactly what would be uploaded into the local folder DIR; no network")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from headstart.heads.push import push

    return push(
        args.heads,
        args.repo_id,
        private=args.private,
        token=args.token,
        message=args.message,
        dry_run=args.dry_run,
    )
