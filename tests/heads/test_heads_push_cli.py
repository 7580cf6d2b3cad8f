"""`headstart push`: uploads a heads directory as-is (mocked Hub client; no network here)."""

from __future__ import annotations

from types import SimpleNamespace

import huggingface_hub

from headstart.cli import main
from headstart.heads.defaults import shipped_heads


class FakeApi:
    calls: list = []

    def __init__(self, token=None):
        self.token = token

    def create_repo(self, repo_id, **kwargs):
        FakeApi.calls.append(("create", repo_id, kwargs))

    def upload_folder(self, **kwargs):
        FakeApi.calls.append(("upload", kwargs))
        return SimpleNamespace(commit_url=f"https://hub.example/{kwargs['repo_id']}/commit/1")


def test_push_uploads_the_heads_files(monkeypatch, capsys):
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    FakeApi.calls = []
    heads = shipped_heads("smollm2")["smollm2-medusa"]
    assert main(["push", str(heads), "me/smollm2-medusa", "--private"]) == 0
    (create, upload) = FakeApi.calls
    assert create[1] == "me/smollm2-medusa" and create[2]["private"] is True
    assert upload[1]["repo_id"] == "me/smollm2-medusa"
    assert set(upload[1]["allow_patterns"]) == {
        "config.json",
        "model.safetensors",
        "README.md",
        "tuned_tree.json",
    }
    assert upload[1]["delete_patterns"] == []  # it has every head file: nothing of the repo's to drop
    assert "pushed medusa heads" in capsys.readouterr().out


def test_push_refuses_a_non_heads_directory(tmp_path, capsys):
    assert main(["push", str(tmp_path), "me/x"]) == 2
    assert "not a heads directory" in capsys.readouterr().err


def test_push_reports_hub_errors(monkeypatch, capsys):
    class Failing(FakeApi):
        def create_repo(self, repo_id, **kwargs):
            raise OSError("401 Unauthorized")

    monkeypatch.setattr(huggingface_hub, "HfApi", Failing)
    heads = shipped_heads("smollm2")["smollm2-medusa"]
    assert main(["push", str(heads), "me/x"]) == 2
    assert "401 Unauthorized" in capsys.readouterr().err


def test_a_push_drops_the_head_files_an_earlier_push_left(monkeypatch, tmp_path):
    """Heads without a card or a tuned tree, pushed where others were: the earlier README.md and
    tuned_tree.json go (a tuned tree of other heads would be read with these), nothing else."""
    import shutil

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    FakeApi.calls = []
    heads = shipped_heads("smollm2")["smollm2-eagle3"]
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(heads / name, bare / name)
    assert main(["push", str(bare), "me/heads"]) == 0
    upload = FakeApi.calls[-1][1]
    assert upload["allow_patterns"] == ["config.json", "model.safetensors"]
    assert upload["delete_patterns"] == ["README.md", "tuned_tree.json"]
