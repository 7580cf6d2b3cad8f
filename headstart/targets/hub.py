"""The Hub without a network: one quick probe before a Hub load instead of huggingface_hub's five
retries a file (eleven warning lines over ~25 s, then an error). Unreachable, the load runs in
offline mode (the local cache only) and a miss is one line that says why."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from urllib.parse import urlparse


def hub_host() -> tuple[str, int]:
    """The Hub endpoint's host and port (HF_ENDPOINT, else huggingface.co)."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def hub_reachable(timeout: float = 3.0) -> bool:
    """A TCP connection to the Hub opens within `timeout` seconds (DNS failure: at once). Cost: one
    connection, made only before a Hub load. Behind a proxy (HTTPS_PROXY, ALL_PROXY...) a direct
    connection says nothing: huggingface_hub goes through the proxy, so no probe is made."""
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy",
                                             "HTTP_PROXY", "http_proxy")):  # fmt: skip
        return True
    try:
        with socket.create_connection(hub_host(), timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def offline_unless_reachable() -> Iterator[bool]:
    """Yields whether the Hub is reachable; when it is not, huggingface_hub (and transformers,
    which asks it) runs offline inside: cached files load, missing ones fail at once."""
    import huggingface_hub.constants as constants

    if constants.HF_HUB_OFFLINE or hub_reachable():
        yield True
        return
    previous = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield False
    finally:
        constants.HF_HUB_OFFLINE = previous
