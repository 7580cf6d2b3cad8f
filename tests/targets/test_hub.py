"""Hub ids go through transformers' normal hub loading; tested offline against a local hub cache."""

from __future__ import annotations

import shutil

import pytest
from tiny import make_target_dir

from headstart.errors import HeadstartError
from headstart.targets import load_target, resolve_spec

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _fake_hub_cache(tmp_path, tiny_root, repo="tiny-org/tiny-llama"):
    """Lay a saved model out exactly as huggingface_hub's cache does (refs/main -> snapshot)."""
    cache = tmp_path / "hub"
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(COMMIT)
    shutil.copytree(make_target_dir(tiny_root, "qwen2"), folder / "snapshots" / COMMIT)
    return cache


def test_hub_id_loads_through_hub_cache(tmp_path, tiny_root, monkeypatch):
    cache = _fake_hub_cache(tmp_path, tiny_root)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    assert resolve_spec("tiny-org/tiny-llama") == ("hub", None)
    target = load_target("tiny-org/tiny-llama")
    assert target.fingerprint["kind"] == "hub" and target.fingerprint["name"] == "tiny-org/tiny-llama"
    assert target.fingerprint["model_type"] == "qwen2" and target.hidden_size == 64
    assert target.fingerprint["revision"] == COMMIT  # resolved through refs/main, i.e. the hub path


def test_unreachable_hub_id_fails_clearly(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HeadstartError, match="cannot load target 'nobody/nothing'"):
        load_target("nobody/nothing")
