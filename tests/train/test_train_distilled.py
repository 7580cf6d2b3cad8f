"""End to end through the CLI: `headstart distill` on a tiny target, then `headstart train` on
its output, online and offline (cached features); data from another target is refused."""

from __future__ import annotations

import json

import pytest
import torch
from tiny import make_target_dir

from headstart.cli import main
from headstart.errors import HeadstartError
from headstart.heads import load_heads


@pytest.fixture(scope="module")
def distilled(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("distilled")
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"Question {i}: what is {i} plus {i}?"}) + "\n" for i in range(10))
    )
    out = root / "data"
    code = main(
        [
            "distill",
            "--target",
            str(tiny_llama),
            "--prompts",
            str(prompts),
            "--shape",
            "prompt",
            "--out",
            str(out),
            "--num",
            "10",
            "--max-new-tokens",
            "12",
            "--max-prompt-tokens",
            "200",
            "--batch-size",
            "5",
            "--cache-features",
            "--feature-layers",
            "eagle3,last",
            "--quiet",
        ]
    )
    assert code == 0
    return out


def _recipe(tmp_path, target, data, **extra):
    body = {
        "target": str(target),
        "output_dir": str(tmp_path / "run"),
        "max_steps": 4,
        "batch_size": 2,
        "eval_every": 4,
        "log_every": 2,
        "save_every": 0,
        "trackers": ["none"],
        "data": {"path": str(data), "holdout": 2},
    }
    body.update(extra)
    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps(body))  # JSON is YAML
    return path


@pytest.fixture(scope="module")
def twin(distilled, tmp_path_factory):
    """A copy of the distilled directory: a second source with the same conversations (one
    directory named twice is refused: its conversations would count twice)."""
    import shutil

    return shutil.copytree(distilled, tmp_path_factory.mktemp("twin") / "data")


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
@pytest.mark.parametrize("mode", ["online", "offline"])
def test_train_from_distilled_dir(distilled, tiny_llama, tmp_path, mode, kind, capsys):
    from headstart.targets import load_target

    head_spec = {"kind": kind, "draft_vocab_size": 64} | ({"block_size": 4} if kind == "dflash" else {})
    recipe = _recipe(tmp_path, tiny_llama, distilled, head=head_spec)
    depth = ["loss.ttt_steps=2"] if kind == "eagle3" else []  # DFlash drafts its block: no TTT depth
    assert main(["train", "--recipe", str(recipe), f"data.mode={mode}", *depth]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 4 and summary["final_eval"]["eval/predictions"] > 0
    head = load_heads(tmp_path / "run" / "final", load_target(str(tiny_llama)))
    assert head.kind == kind and head.draft_vocab_size == 64
    card = (tmp_path / "run" / "final" / "README.md").read_text()
    assert "(10 conversations)" in card
    # how to rebuild it, and the prompts by file name (not a path on the machine that distilled)
    from headstart.provenance import portable

    # the card names no path of this machine: the recipe by its last two parts
    command = " ".join(
        [f"command: headstart train --recipe {portable(str(recipe))} data.mode={mode}", *depth]
    )
    assert command in card
    assert "\n- prompt sources: prompts.jsonl\n" in card


def test_distilled_data_from_another_target_is_refused(distilled, tiny_root, tmp_path, capsys):
    other = make_target_dir(tiny_root, "qwen2")
    recipe = _recipe(tmp_path, other, distilled)
    assert main(["train", "--recipe", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "was distilled from" in err and "tiny-llama" in err and "tiny-qwen2" in err
    assert not (tmp_path / "run").exists()  # nothing was computed or written


def test_train_joins_several_distilled_dirs(distilled, twin, tiny_llama, tmp_path, capsys):
    from headstart.config import load_config
    from headstart.train.config import TrainConfig
    from headstart.train.data import load_distilled_data

    cfg = load_config(
        TrainConfig,
        None,
        [f"target={tiny_llama}", f"data.path=[{distilled},{twin}]", "data.mode=offline"],
    )
    joined = load_distilled_data(cfg.data)
    single = load_distilled_data(
        load_config(TrainConfig, None, [f"data.path={distilled}", "data.mode=offline"]).data
    )
    assert len(joined) == 2 * len(single) and joined.input_ids[len(single) :] == single.input_ids
    last = len(joined) - 1
    torch.testing.assert_close(joined.features(last)["last"], single.features(len(single) - 1)["last"])
    recipe = _recipe(tmp_path, tiny_llama, distilled, head={"kind": "medusa", "num_heads": 2})
    assert main(["train", "--recipe", str(recipe), f"data.path=[{distilled},{twin}]"]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["data"].count("(10 conversations)") == 2


def test_eval_path_is_held_out_only_and_max_records_cuts_training_data(distilled, twin, tiny_llama, tmp_path):
    from headstart.config import load_config
    from headstart.targets import load_target
    from headstart.train.config import TrainConfig
    from headstart.train.setup import plan

    cfg = load_config(
        TrainConfig,
        None,
        [f"target={tiny_llama}", f"data.path={distilled}", f"data.eval_path={twin}",
         "data.mode=offline", "data.max_records=7", "batch_size=2"],
    )  # fmt: skip
    assert cfg.data.holdout == 0.0  # eval_path replaces the default 5% split
    p = plan(cfg, target=load_target(str(tiny_llama)))
    assert len(p.data) == 17 and p.data.train_count == 7
    assert p.train_idx == list(range(7)) and p.eval_idx == list(range(7, 17))
    # the held-out conversations are eval_path's, features included
    torch.testing.assert_close(p.data.features(7)["last"], p.data.features(0)["last"])
    assert "held out:" in p.data.description
    both = load_config(TrainConfig, None, [f"target={tiny_llama}", f"data.path={distilled}",
                                           f"data.eval_path={twin}", "data.holdout=2", "batch_size=2"])  # fmt: skip
    p = plan(both, target=p.target)
    assert len(p.train_idx) == 8 and len(p.eval_idx) == 12 and set(p.train_idx).isdisjoint(p.eval_idx)
    from headstart.errors import HeadstartError

    # one directory spelt two ways is still one: trained on and held out, it would inflate the eval
    for spelt in (f"{distilled}/", f"{distilled}/../{distilled.name}"):
        with pytest.raises(HeadstartError, match="more than once"):
            load_config(
                TrainConfig,
                None,
                [f"target={tiny_llama}", f"data.path={distilled}", f"data.eval_path={spelt}"],
            )


def test_stdout_holds_only_the_summary_whatever_libraries_print(
    distilled, tiny_llama, tmp_path, capsys, monkeypatch
):
    """A library printing while training (deepspeed's notices did) goes to stderr: stdout stays
    one JSON object that a script can parse."""
    import headstart.train.loop as loop

    real = loop.train

    def noisy(*args, **kwargs):
        print("[WARNING] a library notice on stdout")
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "train", noisy)
    recipe = _recipe(tmp_path, tiny_llama, distilled, head={"kind": "medusa", "num_heads": 2})
    assert main(["train", "--recipe", str(recipe)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["steps"] == 4
    assert "a library notice" in captured.err


def test_max_records_from_each_keeps_the_mix_of_sources_and_nests():
    from headstart.train.config import DataConfig
    from headstart.train.data import _record_counts

    sizes = [2400, 647, 7473, 20000]
    for n in (4000, 12000):
        counts = _record_counts(sizes, DataConfig(path=["x"], max_records=n, max_records_from="each"))
        assert sum(counts) == n and all(
            abs(c - n * s / sum(sizes)) < 1 for c, s in zip(counts, sizes, strict=True)
        )
    small = _record_counts(sizes, DataConfig(path=["x"], max_records=4000, max_records_from="each"))
    large = _record_counts(sizes, DataConfig(path=["x"], max_records=12000, max_records_from="each"))
    assert all(a <= b for a, b in zip(small, large, strict=True))  # a smaller size nests in a larger one
    assert _record_counts(sizes, DataConfig(path=["x"], max_records=3000)) == [2400, 600, 0, 0]
    assert _record_counts(sizes, DataConfig(path=["x"], max_records=10**6, max_records_from="each")) == sizes


def test_shares_take_the_mix_asked_for_and_refuse_what_a_directory_lacks():
    from headstart.train.config import DataConfig
    from headstart.train.data import _record_counts

    sizes, paths = [2400, 647, 7473, 20000], ["a", "b", "c", "d"]
    mix = DataConfig(path=paths, max_records=1200, shares=[0.5, 0.0, 0.25, 0.25])
    assert _record_counts(sizes, mix) == [600, 0, 300, 300]
    odd = DataConfig(path=paths, max_records=1001, shares=[0.5, 0.0, 0.25, 0.25])
    assert sum(_record_counts(sizes, odd)) == 1001  # the remainder to the largest fractions
    with pytest.raises(HeadstartError, match="holds 647"):
        _record_counts(sizes, DataConfig(path=paths, max_records=2000, shares=[0.0, 0.5, 0.0, 0.5]))
    for bad in ([0.5, 0.5], [0.5, 0.5, 0.5, -0.5], [0.3, 0.3, 0.3, 0.3]):
        with pytest.raises(HeadstartError, match="data.shares"):
            DataConfig(path=paths, max_records=100, shares=bad)
    with pytest.raises(HeadstartError, match="data.shares"):
        DataConfig(path=paths, shares=[0.25] * 4)  # a share of no size


def test_max_records_from_each_on_joined_directories(distilled, twin, tiny_llama):
    from headstart.config import load_config
    from headstart.train.config import TrainConfig
    from headstart.train.data import load_distilled_data

    cfg = load_config(TrainConfig, None, [f"target={tiny_llama}", f"data.path=[{distilled},{twin}]",
                                          "data.max_records=6", "data.max_records_from=each"])  # fmt: skip
    data = load_distilled_data(cfg.data)
    assert len(data) == 6 and data.input_ids[:3] == data.input_ids[3:]  # 3 of each, the first 3
    with pytest.raises(Exception, match="max_records_from"):
        load_config(TrainConfig, None, [f"data.path={distilled}", "data.max_records_from=random"])


def test_a_packed_directory_trains_like_the_distilled_one(distilled, tiny_llama, tmp_path, capsys):
    """`python -m headstart.distill.pack`: Parquet shards, no text, ids narrowed; the records read
    back equal, each file stays under its limit, a foreign directory is refused, and online
    training runs from it (features are not packed)."""
    from headstart.distill import load_distilled
    from headstart.distill.pack import main as pack_main
    from headstart.distill.pack import pack

    packed = tmp_path / "packed"
    manifest = pack(distilled, packed)
    assert manifest["records"] == 10 and len(manifest["files"]) == 1
    ours, theirs = load_distilled(distilled), load_distilled(packed)
    assert theirs["input_ids"] == ours["input_ids"] and theirs["loss_mask"] == ours["loss_mask"]
    assert "messages" not in theirs.column_names and theirs["index"] == ours["index"]
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    assert pack_main([str(distilled), str(tmp_path / "foreign")]) == 2
    assert (tmp_path / "foreign" / "notes.txt").read_text() == "mine"
    assert pack_main([str(distilled), str(packed), "--keep-text"]) == 0  # an earlier pack is replaced
    assert "messages" in load_distilled(packed).column_names
    capsys.readouterr()
    recipe = _recipe(tmp_path, tiny_llama, packed, head={"kind": "eagle3", "draft_vocab_size": 64})
    # the features stayed behind: offline training is refused as the data loads, not at the
    # first batch after the target and head are built
    assert json.loads((packed / "distill_meta.json").read_text())["feature_layers"] == []
    assert main(["train", "--recipe", str(recipe), "data.mode=offline"]) == 2
    assert "has none (distilled without --cache-features, or packed" in capsys.readouterr().err
    assert main(["train", "--recipe", str(recipe), "data.mode=online", "loss.ttt_steps=2"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 4


def test_verify_finds_a_changed_missing_or_extra_shard(distilled, tmp_path, capsys):
    """`pack --verify`: a packed directory passes as written; a flipped byte, a missing shard and
    a shard the manifest does not list and a manifest without its file list each fail with a
    one-line error and exit 2."""
    import shutil

    from headstart.distill.pack import main as pack_main
    from headstart.distill.pack import pack, verify

    packed = tmp_path / "packed"
    pack(distilled, packed, max_bytes=2_000)  # several shards
    shards = sorted((packed / "data").glob("shard-*.parquet"))
    assert len(shards) >= 2 and verify(packed)["records"] == 10
    assert pack_main(["--verify", str(packed)]) == 0
    damages = {
        "differs from pack.json": lambda data: data[0].write_bytes(data[0].read_bytes()[:-1] + b"x"),
        "do not match": lambda data: data[1].unlink(),
        "shard-00099": lambda data: shutil.copy(data[0], data[0].parent / "shard-00099.parquet"),
        "no readable pack.json": lambda data: (data[0].parent.parent / "pack.json").write_text("{}"),
    }
    for number, (expected, damage) in enumerate(damages.items()):
        copy = tmp_path / f"copy{number}"
        shutil.copytree(packed, copy)
        damage(sorted((copy / "data").glob("shard-*.parquet")))
        capsys.readouterr()
        assert pack_main(["--verify", str(copy)]) == 2
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1


def test_packed_shards_stay_under_the_size_limit(tmp_path):
    """400,000 random token ids (incompressible: ~2 bytes each) under a 300 KB limit."""
    import pyarrow as pa

    from headstart.distill.pack import _write_shards

    ids = torch.randint(0, 49152, (2000, 200), generator=torch.Generator().manual_seed(0))
    table = pa.table({"input_ids": pa.array(ids.tolist(), type=pa.list_(pa.uint16()))})
    files = _write_shards(table, tmp_path, 300_000)
    assert len(files) >= 3 and all(f.stat().st_size <= 300_000 for f in files)
    import pyarrow.parquet as pq

    assert pa.concat_tables([pq.read_table(f) for f in files]).equals(table)


def test_init_from_a_published_head_scores_it_with_the_same_evaluator(
    distilled, tiny_llama, tmp_path, capsys
):
    """init_from takes a head in the speculators format (imported as --heads imports it): with
    max_steps=0 it is scored by headstart's own held-out evaluator, as its source head was."""
    recipe = _recipe(
        tmp_path,
        tiny_llama,
        distilled,
        head={"kind": "eagle3", "draft_vocab_size": 64, "layout": "reference"},
    )
    assert main(["train", "--recipe", str(recipe), "data.mode=offline", "loss.ttt_steps=2"]) == 0
    original = json.loads(capsys.readouterr().out)["final_eval"]
    published = tmp_path / "published"
    assert main(["export", str(tmp_path / "run" / "final"), "--format", "speculators", "--dtype", "float32",
                 "--target", str(tiny_llama), "--output", str(published)]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["train", "--recipe", str(recipe), "data.mode=offline", "loss.ttt_steps=2", "max_steps=0",
                 f"init_from={published}", f"output_dir={tmp_path / 'scored'}"]) == 0  # fmt: skip
    scored = json.loads(capsys.readouterr().out)["final_eval"]
    for key in ("eval/top1/step0", "eval/top1/step1", "eval/accept_len_est"):
        assert scored[key] == pytest.approx(original[key], abs=1e-6), key
    card = (tmp_path / "scored" / "final" / "README.md").read_text()
    assert "speculators format, imported" in card
