"""`headstart push`: what it stages and uploads (a fake Hub client: no network here; `--dry-run`
writes the staged files for real)."""

from __future__ import annotations

from types import SimpleNamespace

import huggingface_hub
import pytest

from headstart.cli import main
from headstart.heads.defaults import shipped_heads


@pytest.fixture(autouse=True)
def hub_up(monkeypatch):
    """The fake client stands in for a reachable Hub (the probe itself is tested below)."""
    import headstart.targets.hub as hub

    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: True)


class FakeApi:
    calls: list = []
    marks: dict = {}  # repo id -> the .headstart-push.json an earlier push left there

    def __init__(self, token=None):
        self.token = token

    def hf_hub_download(self, repo_id, filename, repo_type):
        from huggingface_hub.errors import EntryNotFoundError

        if repo_id not in FakeApi.marks:
            raise EntryNotFoundError(f"{filename} not in {repo_id}")
        path = FakeApi.marks[repo_id]
        return str(path)

    def create_repo(self, repo_id, **kwargs):
        FakeApi.calls.append(("create", repo_id, kwargs))

    def upload_folder(self, **kwargs):
        from pathlib import Path

        kwargs["sent"] = {p.name: p.read_bytes() for p in Path(kwargs["folder_path"]).iterdir()}
        FakeApi.calls.append(("upload", kwargs))
        return SimpleNamespace(commit_url=f"https://hub.example/{kwargs['repo_id']}/commit/1")


def test_push_uploads_the_heads_files(monkeypatch, capsys):
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    FakeApi.calls, FakeApi.marks = [], {}
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
        ".headstart-push.json",
    }
    assert upload[1]["delete_patterns"] is None  # no earlier headstart push: nothing of the repo's goes
    assert (
        b"/root/" not in upload[1]["sent"]["config.json"]
        and b'"_name_or_path"' not in upload[1]["sent"]["config.json"]
    )
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


def test_a_push_removes_only_what_an_earlier_push_listed_and_never_a_card(monkeypatch, tmp_path):
    """Heads without a tuned tree, pushed where an earlier push left one: its tuned_tree.json goes
    (a tuned tree of other heads would be read with these); the card is replaced, never deleted;
    names a push never writes are never sent for deletion, whatever an (edited) mark lists."""
    import json
    import shutil

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    FakeApi.calls = []
    mark = tmp_path / "mark.json"
    mark.write_text(json.dumps({"files": ["README.md", "config.json", "model.safetensors", "tuned_tree.json",
                                          "medusa_lm_head.pt", "*", "notes.md", ".headstart-push.json"]}))  # fmt: skip
    FakeApi.marks = {"me/heads": mark}
    heads = shipped_heads("smollm2")["smollm2-eagle3"]
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(heads / name, bare / name)
    assert main(["push", str(bare), "me/heads"]) == 0
    upload = FakeApi.calls[-1][1]
    assert upload["allow_patterns"] == [
        "README.md",
        "config.json",
        "model.safetensors",
        ".headstart-push.json",
    ]
    # only head files a push writes, as literal names: never a glob ("*" would match the whole repo)
    assert upload["delete_patterns"] == ["tuned_tree.json"]
    assert b"base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in upload["sent"]["README.md"]  # a card made


def test_push_dry_run_writes_exactly_what_would_be_uploaded(monkeypatch, tmp_path, capsys):
    import json

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    FakeApi.calls, FakeApi.marks = [], {}
    heads = shipped_heads("smollm2")["smollm2-eagle3"]
    out = tmp_path / "staged"
    assert main(["push", str(heads), "--dry-run", str(out)]) == 0
    assert FakeApi.calls == []  # no network
    assert main(["push", str(heads), "me/x"]) == 0
    sent = FakeApi.calls[-1][1]["sent"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == sent
    card = (out / "README.md").read_text()
    for field in ("base_model: HuggingFaceTB/SmolLM2-135M-Instruct", "license: apache-2.0",
                  "pipeline_tag: text-generation", "type: accuracy"):  # fmt: skip
        assert field in card
    assert set(json.loads((out / ".headstart-push.json").read_text())["files"]) == set(sent)
    (out / "mine.txt").write_text("mine")
    assert main(["push", str(heads), "--dry-run", str(out)]) == 0  # an earlier dry run: written again
    assert (out / "mine.txt").read_text() == "mine"


def test_push_without_a_network_is_one_line_at_once(monkeypatch, capsys):
    """A real probe of an endpoint nothing listens on: refused at once, no retries."""
    import time

    import headstart.targets.hub as hub

    monkeypatch.undo()
    monkeypatch.setattr(hub, "hub_host", lambda: ("127.0.0.1", 9))  # discard port: nothing listens
    started = time.perf_counter()
    assert main(["push", str(shipped_heads("smollm2")["smollm2-medusa"]), "me/x"]) == 2
    err = capsys.readouterr().err
    assert time.perf_counter() - started < 5 and len(err.strip().splitlines()) == 1
    assert "127.0.0.1 cannot be reached (no network?)" in err and "--dry-run" in err


def test_a_hub_id_without_a_network_is_one_line_at_once(monkeypatch, capsys):
    """No network and not in the cache: the Hub target and Hub heads fail in one line, without
    huggingface_hub's five retries a file (HF_ENDPOINT points at a port nothing listens on)."""
    import time

    monkeypatch.undo()
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HUB_CACHE", "/nonexistent-headstart-cache")
    started = time.perf_counter()
    assert main(["info", "--target", "someone/not-cached-model"]) == 2
    assert main(["generate", "--target", "someone/not-cached-model", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert time.perf_counter() - started < 20
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 2 and all("cannot be reached (no network?)" in line for line in lines), err
