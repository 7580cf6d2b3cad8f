"""Where a `--heads` argument points: a local directory, or a Hub id downloaded to the cache."""

from __future__ import annotations

from pathlib import Path

from headstart.errors import HeadstartError
from headstart.targets.load import HUB_ID


def resolve_heads(spec: str | Path, flag: str = "--heads") -> Path:
    """The local directory of heads named by `spec`. A path that exists must be a directory; a
    name that looks like a path (its parent directory exists here, or it starts with . / ~) is
    reported as missing locally rather than looked up on the Hub."""
    text = str(spec)
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise HeadstartError(f"{flag} {text} is a file", f"pass the directory that holds it: {path.parent}")
    parent = path.parent
    local = text.startswith((".", "/", "~")) or (str(parent) not in ("", ".") and parent.is_dir())
    if local or not HUB_ID.match(text):
        raise HeadstartError(
            f"{flag} {text}: no such directory",
            "pass a directory written by `headstart train`/`export`, or a Hub id",
        )
    from huggingface_hub import snapshot_download

    from headstart.targets.hub import hub_host, offline_unless_reachable

    with offline_unless_reachable() as online:
        try:
            return Path(snapshot_download(text))
        except Exception as err:  # the hub client raises many types; its message says which
            if not online:
                raise HeadstartError(
                    f"cannot download heads '{text}': {hub_host()[0]} cannot be reached (no network?) and "
                    "they are not in the local Hub cache",
                    "connect to the network, or pass a local heads directory",
                ) from None
            raise HeadstartError(
                f"cannot download heads '{text}': {str(err).splitlines()[0]}",
                "check the id, your network or HF_TOKEN",
            ) from None
