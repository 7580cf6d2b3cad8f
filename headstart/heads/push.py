"""Publishing trained heads (with their model card and tuned tree) to the Hub: `headstart push`.

What is uploaded is staged first (`stage`): the heads' files, config.json without this machine's
paths, a model card (the directory's own, else one written from the config), and the push's mark
(`.headstart-push.json`, the files it uploads). A later push removes from the repo only files an
earlier push's mark lists and this one lacks (never a model card): whatever else the repo holds
stays. `--dry-run DIR` writes the staged files into DIR instead of uploading them."""

from __future__ import annotations

import glob
import json
from pathlib import Path

from headstart.errors import HeadstartError

UPLOADED = ("config.json", "model.safetensors", "README.md", "tuned_tree.json")
"""What a heads directory publishes (and an export's own files); training checkpoints and logs stay local."""
PUSH_MARK = ".headstart-push.json"
"""Uploaded with every push: the files it sent, so the next push knows which ones are its own."""
CARD = "README.md"


def push(
    heads: str | Path,
    repo_id: str | None,
    *,
    private: bool = False,
    token: str | None = None,
    message: str = "Upload headstart draft heads",
    dry_run: str | None = None,
) -> int:
    """Upload the heads directory `heads` to the Hub repo `repo_id` (`dry_run`: stage into that
    local folder instead). Returns the exit status."""
    folder = Path(heads)
    label, files = checked_upload(folder)
    if dry_run is not None:
        return stage_locally(dry_run, repo_id, private, folder, files, label)
    if not repo_id:
        raise HeadstartError("push needs a repo id", "headstart push HEADS your-org/name (or --dry-run DIR)")
    import tempfile

    from huggingface_hub import HfApi

    from headstart.targets.hub import hub_host, hub_reachable

    if not hub_reachable():  # huggingface_hub would retry each request five times, printing each
        raise HeadstartError(
            f"cannot push to '{repo_id}': {hub_host()[0]} cannot be reached (no network?)",
            "connect to the network, or stage the upload with --dry-run DIR and push it later",
        )
    api = HfApi(token=token)
    with tempfile.TemporaryDirectory(prefix="headstart-push-") as tmp:
        staged = stage(folder, files, Path(tmp))
        try:
            api.create_repo(repo_id, private=private or None, exist_ok=True, repo_type="model")
            stale = [glob.escape(name) for name in earlier_push(api, repo_id)
                     if name not in staged and name in head_files()]  # fmt: skip
            info = api.upload_folder(
                repo_id=repo_id,
                folder_path=tmp,
                allow_patterns=staged,
                # an earlier push's head files that this one lacks (a tuned tree of other heads)
                # would be read with the new heads; only files that push's mark lists go
                delete_patterns=stale or None,
                commit_message=message,
                repo_type="model",
            )
        except HeadstartError:
            raise
        except Exception as err:  # the hub client raises many types; its message says which
            raise HeadstartError(
                f"cannot push to '{repo_id}': {str(err).splitlines()[0]}",
                "check the repo id, your network and HF_TOKEN (huggingface-cli login)",
            ) from None
    print(f"pushed {label} ({', '.join(staged)}) -> {getattr(info, 'commit_url', info)}")
    return 0


def stage_locally(
    out_dir: str, repo_id: str | None, private: bool, folder: Path, files: list[str], label: str
) -> int:
    """Stage into `--dry-run DIR` (the output rule: new, empty or an earlier dry run's folder)."""
    from headstart.outputs import check_output, publish_dir

    if repo_id or private:
        raise HeadstartError("--dry-run uploads nothing: the repo id and --private would be ignored",
                             "drop them, or drop --dry-run")  # fmt: skip
    out = check_output(out_dir, "--dry-run", owned=lambda p: (p / PUSH_MARK).is_file(),
                       command="`headstart push --dry-run`", inputs=[folder], can_overwrite=False)  # fmt: skip
    earlier = read_mark(out / PUSH_MARK) if (out / PUSH_MARK).is_file() else []
    staged: list[str] = []
    publish_dir(out, lambda tmp: staged.extend(stage(folder, files, tmp)), stale=earlier)
    print(f"would push {label}: {', '.join(staged)} (staged in {out}; a real push also removes the "
          f"files an earlier push's {PUSH_MARK} lists and this one lacks, never {CARD})")  # fmt: skip
    return 0


def stage(folder: Path, files: list[str], out: Path) -> list[str]:
    """Write into `out` what a push of `folder` uploads; returns the file names, mark included."""
    import shutil

    from headstart.heads.formats import detect_format

    fmt = detect_format(folder)
    for name in files:
        shutil.copyfile(folder / name, out / name)
    if fmt == "headstart":  # a training run's config names the machine's paths; the Hub's must not
        from headstart.heads import HeadConfig

        config = HeadConfig.read(folder)
        (out / "config.json").write_text(config.portable().to_json())
        if CARD not in files:
            from headstart.heads.checkpoint import model_card

            model_card(config).save(out / CARD)
    staged = sorted(p.name for p in out.iterdir())
    (out / PUSH_MARK).write_text(json.dumps({"files": [*staged, PUSH_MARK]}, indent=1) + "\n")
    return [*staged, PUSH_MARK]


def head_files() -> set[str]:
    """Every name a push of any format uploads, its mark included, the card left out: what a
    later push may remove from the repo (a mark is a file anyone can edit)."""
    from headstart.heads.formats import FORMATS, adapter

    return (set(UPLOADED) | {PUSH_MARK}).union(*(adapter(fmt).FILES for fmt in FORMATS)) - {CARD}


def read_mark(path: Path) -> list[str]:
    """The files a push's mark lists ([] when it is unreadable: a damaged mark proves nothing)."""
    try:
        files = json.loads(path.read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return []
    return [f for f in files if isinstance(f, str) and "/" not in f] if isinstance(files, list) else []


def earlier_push(api: object, repo_id: str) -> list[str]:
    """The files the repo's last headstart push uploaded ([] for a new repo or one no headstart
    push wrote: then nothing is removed)."""
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        path = api.hf_hub_download(repo_id=repo_id, filename=PUSH_MARK, repo_type="model")  # type: ignore[attr-defined]
    except (EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError):
        return []
    return read_mark(Path(path))


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
    label = f"{fmt} export of heads"
    if fmt == "headstart":
        from headstart.heads import HeadConfig

        label = f"{HeadConfig.read(folder).kind} heads"  # every field checked
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
