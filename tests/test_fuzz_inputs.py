"""Property-based fuzzing (Hypothesis) of what users type and the files they hand over: command
lines, question files, prompt files, recipes and head configs. The property everywhere: the input
is accepted, or refused with a HeadstartError (one line, exit 2 at the CLI); never another
exception. Bounded in time (a fixed number of examples, no deadline per example) so it runs in the
default test run; `HYPOTHESIS_PROFILE=long` runs ten times as many.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headstart.cli import build_parser, main
from headstart.errors import HeadstartError

settings.register_profile(
    "default", max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)
settings.register_profile("long", max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


class Reached(Exception):
    """The command passed its checks and asked for the target: where the fuzz stops it."""


@pytest.fixture(scope="module")
def pool(tmp_path_factory, tiny_llama):
    """Existing paths for arguments to point at (heads, files, dirs), never written by a run."""
    from headstart.heads import HeadSpec, build_head
    from headstart.targets import load_target

    root = tmp_path_factory.mktemp("fuzz-pool")
    target = load_target(str(tiny_llama))
    for kind in ("eagle3", "medusa"):
        spec = HeadSpec(kind=kind, draft_vocab_size=60 if kind == "eagle3" else 0)
        build_head(spec, target, token_counts=torch.arange(288.0)).save_pretrained(root / f"heads-{kind}")
    (root / "q.jsonl").write_text('{"prompt": "hello"}\n{"turns": ["a", "b"]}\n')
    (root / "notes.txt").write_text("mine")
    (root / "dir").mkdir()
    return root, target


def _value_strategy(root: Path, target_dir: Path):
    texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
    surrogates = st.just("\udcff\udcfehi")
    paths = st.sampled_from([str(root / n) for n in ("heads-eagle3", "heads-medusa", "q.jsonl", "notes.txt", "dir")]
                            + [str(target_dir), "/proc/x", ".", "..", "", "/nonexistent/x", "org/name"])  # fmt: skip
    numbers = st.one_of(st.integers(-(10**12), 10**12), st.floats(allow_nan=True, allow_infinity=True))
    specials = st.sampled_from(["0", "-1", "1", "nan", "inf", "-inf", "1e309", "2/3", "0/0", "9/4", "a=b", "x.y=1",
                                "cpu", "cuda", "gpu", "auto", "float32", "chain:3", "static", "dynamic", "[[0]]",
                                "dynamic:depth=0", "chain:-1", "lookup:4", "+lookup:0", "vanilla,pld", ",",
                                "http://127.0.0.1:9/v1", "ftp://x", "openai", "dataset", "eagle3", "mt_bench"])  # fmt: skip
    return st.one_of(texts, surrogates, paths, numbers.map(str), specials)


COMMANDS = ("info", "generate", "chat", "bench", "export", "distill", "tune")
"""Fuzzed through `main`: every one stops at the target load at the latest (push and train are
covered by their file fuzz below; push would reach the network, train the data)."""


def _flags(command: str) -> list[tuple[str, bool]]:
    """(option string, takes a value) of a command's own options, from the real parser."""
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    return [(a.option_strings[-1], a.nargs != 0) for a in sub._actions
            if a.option_strings and a.option_strings[-1] not in ("--help", "--debug")]  # fmt: skip


@st.composite
def command_lines(draw, root: Path, target_dir: Path):
    command = draw(st.sampled_from(COMMANDS))
    values = _value_strategy(root, target_dir)
    argv = [command]
    flags = _flags(command)
    for flag, takes in draw(st.lists(st.sampled_from(flags), max_size=6)):
        argv += [flag, draw(values)] if takes else [flag]
    if draw(st.booleans()):
        argv += ["--target", str(target_dir)]
    argv += draw(st.lists(values, max_size=2))  # positionals: heads, overrides, junk
    return argv


@pytest.fixture
def stop_at_the_target(monkeypatch, tmp_path):
    import headstart.targets

    def reached(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(headstart.targets, "load_target", reached)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a Hub-looking id fails at once, no network
    monkeypatch.setenv("HEADSTART_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


def _snapshot(root: Path) -> dict[str, int | None]:
    return {str(p.relative_to(root)): None if p.is_dir() else p.stat().st_size for p in root.rglob("*")}


def test_command_lines(pool, tiny_llama, stop_at_the_target, capsys):
    root, _ = pool
    before = _snapshot(root)

    @given(command_lines(root, tiny_llama))
    def check(argv):
        capsys.readouterr()
        try:
            code = main(argv)
        except Reached:
            return
        except SystemExit as exit_:  # argparse
            code = exit_.code
        finally:
            err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith("warning")]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (argv, code, err)

    check()
    assert _snapshot(root) == before  # the pool is read, never written


# ------------------------------------------------------------------------------------------ files

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.floats(allow_nan=False),
              st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)  # fmt: skip
row_keys = st.sampled_from(["prompt", "text", "turns", "conversations", "messages", "question", "instruction",
                            "input", "output", "id", "question_id", "task_id", "category", "from", "value",
                            "role", "content", "system"])  # fmt: skip
rows = st.one_of(st.dictionaries(row_keys, json_values, max_size=4), json_values)
lines = st.one_of(rows.map(lambda r: json.dumps(r).encode()), st.binary(max_size=20))


@given(st.lists(lines, max_size=5))
def test_question_files(tmp_path_factory, content):
    from headstart.bench.questions import load_questions

    path = tmp_path_factory.mktemp("q") / "questions.jsonl"
    path.write_bytes(b"\n".join(content) + b"\n")
    try:
        questions = load_questions(str(path), all_turns=True)
    except HeadstartError as err:
        assert "\n" not in err.one_line()
        return
    assert questions and all(q.turns and all(isinstance(t, str) for t in q.turns) for q in questions)
    # no silent skip, no coercion: one question a non-blank line, its text exactly the row's strings
    parsed = [json.loads(line) for line in b"\n".join(content).split(b"\n") if line.strip()]
    assert len(questions) == len(parsed)
    for question, row in zip(questions, parsed, strict=True):
        assert list(question.turns) == (row["turns"] if "turns" in row else [_first_text(row)])
        given_id = next((row[k] for k in ("question_id", "task_id", "id") if k in row), None)
        assert given_id is None or (type(given_id) in (int, str) and question.question_id == str(given_id))


def _first_text(row: dict) -> str:
    return next(row[k] for k in ("prompt", "text", "question", "instruction") if k in row)


def _strings(value) -> set[str]:
    """Every string inside a JSON value (keys included)."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set(value).union(*(_strings(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_strings(v) for v in value))
    return set()


@given(st.lists(lines, max_size=5), st.sampled_from(["auto", "sharegpt", "messages", "alpaca", "mtbench", "prompt",
                                                     "text"]), st.sampled_from([None, "question", "prompt"]))  # fmt: skip
def test_prompt_files(tmp_path_factory, content, shape, field):
    from headstart.distill.shapes import Skip, to_conversation
    from headstart.distill.sources import BadRow, read_rows

    folder = tmp_path_factory.mktemp("p")
    for name, payload in (
        ("rows.jsonl", b"\n".join(content)),
        ("rows.json", b"[" + b",".join(content) + b"]"),
    ):
        path = folder / name
        path.write_bytes(payload)
        try:
            for _, row in read_rows(str(path), "train"):
                if isinstance(row, BadRow):
                    continue
                try:
                    conversation = to_conversation(row, shape, field)
                except Skip:
                    continue
                assert conversation.turns and all(isinstance(t, str) for t in conversation.turns)
                # no coercion: a prompt is text the row holds (an alpaca prompt joins two of them)
                texts = _strings(row)
                assert all(
                    t in texts or any(part in texts for part in t.split("\n\n")) for t in conversation.turns
                )
        except HeadstartError as err:
            assert "\n" not in err.one_line()


TRAIN_KEYS = ["target", "output_dir", "batch_size", "max_steps", "seed", "head", "data", "optim", "loss", "lora",
              "head.kind", "head.num_heads", "head.feature_layers", "head.draft_vocab_size", "head.layout",
              "data.path", "data.mode", "data.max_length", "data.holdout", "optim.lr", "optim.schedule",
              "optim.betas", "optim.freeze", "loss.ttt_steps", "mixed_precision", "trackers", "bogus"]  # fmt: skip


@given(
    st.dictionaries(st.sampled_from(TRAIN_KEYS), json_values, max_size=5),
    st.sampled_from(["train", "distill"]),
)
def test_recipes(tmp_path_factory, entries, stage):
    import yaml

    from headstart.config import load_config
    from headstart.distill.config import DistillConfig
    from headstart.train.config import TrainConfig

    tree: dict = {}
    for key, value in entries.items():
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
        node[leaf] = value
    path = tmp_path_factory.mktemp("r") / "recipe.yaml"
    path.write_text(yaml.safe_dump(tree))
    try:
        load_config(TrainConfig if stage == "train" else DistillConfig, path)
    except HeadstartError as err:
        assert "\n" not in err.one_line()


HEAD_KEYS = ["kind", "hidden_size", "vocab_size", "target", "target_config", "num_heads", "num_layers",
             "shared_lm_head", "feature_layers", "draft_vocab_size", "input_norms", "layout", "own_embeddings",
             "training", "format"]  # fmt: skip


@given(st.sampled_from(["heads-eagle3", "heads-medusa"]), st.lists(st.tuples(st.sampled_from(HEAD_KEYS),
       st.one_of(st.none(), json_values, st.integers(-5, 300))), max_size=3), st.booleans())  # fmt: skip
def test_head_configs(pool, tmp_path_factory, name, edits, drop):
    from headstart.heads import load_heads

    root, target = pool
    folder = tmp_path_factory.mktemp("h") / name
    shutil.copytree(root / name, folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in edits:
        if drop and value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    try:
        load_heads(folder, target)
    except HeadstartError as err:
        assert "\n" not in err.one_line()


tree_parts = st.sampled_from(["chain:", "dynamic", "dynamic:", "depth=", "top_k=", "total_tokens=", "static",
                              "+lookup:", "[", "]", "[[0]", ",", "0", "1", "-1", "99", "x", "=", ":", " ", "1e9",
                              "[[0],[0,0],[1]]", "{}", "null", "2.5"])  # fmt: skip


@given(
    st.one_of(st.lists(tree_parts, max_size=8).map("".join), st.text(max_size=20)),
    st.sampled_from([None, 1, 4]),
)
def test_tree_specs(spec, max_depth):
    """--tree: a tree, or one line naming what is wrong with the spec."""
    from headstart.inference.trees.lookup import split_lookup
    from headstart.inference.trees.spec import parse_tree

    try:
        base, _ = split_lookup(spec)
        parse_tree(base, max_depth=max_depth)
    except HeadstartError as err:
        assert "\n" not in err.one_line()
