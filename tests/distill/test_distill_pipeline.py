"""`run_distill` end to end on a tiny random target: every shape, resume, refusal, bad input, features."""

from __future__ import annotations

import json

import pytest

from headstart.distill import load_distilled, load_features, read_meta
from headstart.distill.pipeline import run_distill
from headstart.errors import HeadstartError

SHAPED_ROWS = {
    "sharegpt": [
        {
            "id": "a",
            "conversations": [
                {"from": "human", "value": "Hi"},
                {"from": "gpt", "value": "x"},
                {"from": "human", "value": "Again"},
            ],
        }
    ],
    "messages": [{"messages": [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Hi"}]}],
    "alpaca": [{"instruction": "Add", "input": "1 2", "output": "3"}],
    "mtbench": [{"question_id": 81, "turns": ["One", "Two"]}],
    "prompt": [{"prompt": "Hi"}],
    "text": [{"text": "Hi"}],
}


def _write(path, rows):
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        path.write_text(json.dumps(rows))
    return str(path)


def _check_records(target, out, expected_turns):
    data = load_distilled(out)
    eos = target.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for row in data:
        assert row["fingerprint"] == target.fingerprint
        assert row["settings"]["max_new_tokens"] == 6
        ids, mask = row["input_ids"], row["loss_mask"]
        assert ids == target.chat.prompt_ids(row["messages"], add_generation_prompt=False) and len(
            mask
        ) == len(ids)
        # every masked run ends with the end-of-turn token; one run per assistant turn
        ends = [i for i in range(len(ids)) if mask[i] and (i + 1 == len(ids) or not mask[i + 1])]
        assert all(ids[i] == eos for i in ends) and len(ends) == expected_turns
        assert [m["role"] for m in row["messages"] if m["role"] != "system"] == [
            "user",
            "assistant",
        ] * expected_turns
        assert len(row["turns_finished"]) == len(row["turns_exact"]) == expected_turns
    return data


@pytest.mark.parametrize(
    ("shape", "suffix", "turns"),
    [
        ("sharegpt", ".json", 2),
        ("messages", ".jsonl", 1),
        ("alpaca", ".parquet", 1),
        ("mtbench", ".jsonl", 2),
        ("prompt", ".json", 1),
        ("text", ".parquet", 1),
    ],
)
def test_every_shape_end_to_end(distill_target, make_cfg, tmp_path, shape, suffix, turns):
    source = _write(tmp_path / f"p{suffix}", SHAPED_ROWS[shape] * 2)
    summary = run_distill(make_cfg(prompts=source, num=2), target=distill_target, quiet=True)
    assert summary["records_total"] == 2 and summary["replies"] == 2 * turns
    data = _check_records(distill_target, str(tmp_path / "out"), turns)
    if shape == "messages":
        assert data[0]["messages"][0] == {"role": "system", "content": "Sys"}
    if shape == "mtbench":
        assert data[0]["source_id"] == "81"


def test_resume_after_a_crash_gives_the_same_records(distill_target, make_cfg, tmp_path, monkeypatch):
    from headstart.distill.dialogue import Dialogue

    source = _write(tmp_path / "p.jsonl", [{"prompt": f"question {i}"} for i in range(7)])
    clean = make_cfg(prompts=source, num=7, out=str(tmp_path / "clean"))
    run_distill(clean, target=distill_target, quiet=True)
    real, calls = Dialogue.answer, {"n": 0}

    def crashing(self, reply):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("simulated crash")
        return real(self, reply)

    monkeypatch.setattr(Dialogue, "answer", crashing)
    cfg = make_cfg(prompts=source, num=7)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_distill(cfg, target=distill_target, quiet=True)
    published = len(load_distilled(cfg.out))
    assert published == 4  # every finished conversation, and nothing half-done
    monkeypatch.setattr(Dialogue, "answer", real)
    summary = run_distill(cfg, target=distill_target, quiet=True)
    assert summary["records_written"] == 7 - published and summary["records_total"] == 7
    resumed = sorted(load_distilled(cfg.out), key=lambda r: r["index"])
    reference = sorted(load_distilled(clean.out), key=lambda r: r["index"])
    assert [r["index"] for r in resumed] == list(range(7))
    assert [r["input_ids"] for r in resumed] == [r["input_ids"] for r in reference]
    # nothing left to do: a rerun writes nothing
    assert run_distill(cfg, target=distill_target, quiet=True)["records_written"] == 0


def test_ctrl_c_in_a_shard_flush_writes_no_record_twice(distill_target, make_cfg, tmp_path, monkeypatch):
    """A Ctrl-C while a shard is written (its fsync) left the records just handed to the writer
    in the finished list too, and the interrupted run's last publish wrote them again: one record
    twice, which training would then see twice."""
    import os

    import headstart.distill.store as store
    from headstart.errors import Interrupted

    source = _write(tmp_path / "p.jsonl", [{"prompt": f"question number {i}?"} for i in range(6)])
    cfg = make_cfg(prompts=source, num=6, shard_size=1)
    real, calls = os.fsync, {"n": 0}

    def interrupted(fd):
        calls["n"] += 1
        if calls["n"] == 3:  # the second shard's (the first fsync is the meta file's)
            raise KeyboardInterrupt
        return real(fd)

    monkeypatch.setattr(store.os, "fsync", interrupted)
    with pytest.raises(Interrupted):
        run_distill(cfg, target=distill_target, quiet=True)
    monkeypatch.setattr(store.os, "fsync", real)
    run_distill(cfg, target=distill_target, quiet=True)
    indices = load_distilled(cfg.out)["index"]
    assert sorted(indices) == list(range(6))  # each once


def test_resume_over_a_damaged_shard_is_one_line(distill_target, make_cfg, tmp_path):
    source = _write(tmp_path / "p.jsonl", [{"prompt": f"question {i}"} for i in range(3)])
    cfg = make_cfg(prompts=source, num=3)
    run_distill(cfg, target=distill_target, quiet=True)
    shard = next((tmp_path / "out" / "data").glob("*.jsonl"))
    shard.write_text(shard.read_text()[:-20])  # cut mid-record, as an editor or a full disk would
    with pytest.raises(HeadstartError, match="is damaged .*line .*JSONDecodeError") as err:
        run_distill(make_cfg(prompts=source, num=4), target=distill_target, quiet=True)
    assert shard.name in err.value.fix


def test_resume_notices_an_edited_prompt_file(distill_target, make_cfg, tmp_path):
    """Resume is checked by content: appending rows resumes; deleting a row (which shifts every
    later one) is refused instead of duplicating one prompt and dropping another."""
    rows = [{"prompt": f"question {i}"} for i in range(4)]
    source = _write(tmp_path / "p.jsonl", rows[:3])
    run_distill(make_cfg(prompts=source, num=3), target=distill_target, quiet=True)
    _write(tmp_path / "p.jsonl", rows)  # appended
    summary = run_distill(make_cfg(prompts=source, num=4), target=distill_target, quiet=True)
    assert summary["records_written"] == 1 and summary["records_total"] == 4
    _write(tmp_path / "p.jsonl", rows[1:] + [{"prompt": "question 4"}])  # first row deleted
    with pytest.raises(HeadstartError, match="row 0 is not the row it answered"):
        run_distill(make_cfg(prompts=source, num=5), target=distill_target, quiet=True)
    assert len(load_distilled(make_cfg().out)) == 4


def test_a_failed_rename_leaves_no_visible_shard(distill_target, make_cfg, tmp_path, monkeypatch):
    import headstart.distill.store as store

    source = _write(tmp_path / "p.jsonl", [{"prompt": "hi"}] * 2)
    cfg = make_cfg(prompts=source, num=2)

    def broken(src, dst):
        raise OSError("disk full")

    run_distill(make_cfg(prompts=source, num=1), target=distill_target, quiet=True)  # meta + first shard
    monkeypatch.setattr(store.os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        run_distill(cfg, target=distill_target, quiet=True)
    assert sorted(p.name for p in (tmp_path / "out" / "data").iterdir()) == ["shard-00000.jsonl"]


def test_output_of_another_target_or_settings_is_refused(distill_target, make_cfg, tmp_path):
    from tiny import make_target_dir

    from headstart.targets import load_target

    source = _write(tmp_path / "p.jsonl", [{"prompt": "hi"}] * 3)
    run_distill(make_cfg(prompts=source, num=1), target=distill_target, quiet=True)
    with pytest.raises(HeadstartError, match="other settings.*max_new_tokens"):
        run_distill(make_cfg(prompts=source, num=2, max_new_tokens=7), target=distill_target, quiet=True)
    other = load_target(
        str(make_target_dir(tmp_path / "other", "llama", seed=3, hidden_size=32, intermediate_size=64))
    )
    with pytest.raises(HeadstartError, match="another target"):
        run_distill(make_cfg(prompts=source, num=2), target=other, quiet=True)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file").write_text("x")
    with pytest.raises(HeadstartError, match="not a distill output"):
        run_distill(make_cfg(prompts=source, out=str(tmp_path / "junk")), target=distill_target, quiet=True)
    # more records with the same settings are fine (num and batch size are not settings of the data)
    assert (
        run_distill(make_cfg(prompts=source, num=3, batch_size=1), target=distill_target, quiet=True)[
            "records_total"
        ]
        == 3
    )


def test_bad_rows_are_skipped_and_counted(distill_target, make_cfg, tmp_path):
    rows = [
        '{"prompt": "fine"}',
        "{oops",
        '{"prompt": ""}',
        '{"prompt": 7}',
        '{"weird": 1}',
        json.dumps({"prompt": "long " * 200}),
        '{"turns": ["short", "' + "x" * 300 + '"]}',
    ]
    source = tmp_path / "p.jsonl"
    source.write_text("\n".join(rows) + "\n")
    summary = run_distill(
        make_cfg(prompts=str(source), num=10, max_prompt_tokens=120), target=distill_target, quiet=True
    )
    assert summary["records_total"] == 2 and summary["source_exhausted"]
    assert summary["skipped"] == {
        "malformed JSON line": 1,
        "empty turn": 1,
        "non-string turn": 1,
        "unknown row shape": 1,
        "too long for --max-prompt-tokens": 1,
        "later turns past --max-prompt-tokens (conversation cut)": 1,
    }
    (tmp_path / "none.jsonl").write_text('{"prompt": ""}\n{"x": 1}\n')
    with pytest.raises(HeadstartError, match="no usable row"):
        run_distill(
            make_cfg(prompts=str(tmp_path / "none.jsonl"), out=str(tmp_path / "o2")),
            target=distill_target,
            quiet=True,
        )
    # the failed run left no output: following its advice into the same --out just works
    assert not (tmp_path / "o2" / "distill_meta.json").exists()
    (tmp_path / "none.jsonl").write_text('{"prompt": "now a real one"}\n')
    again = run_distill(
        make_cfg(prompts=str(tmp_path / "none.jsonl"), out=str(tmp_path / "o2"), num=1),
        target=distill_target,
        quiet=True,
    )
    assert again["records_total"] == 1


def test_byte_order_mark_and_a_non_utf8_line(distill_target, make_cfg, tmp_path):
    """A BOM (Windows editors) is not part of the first row; one line that is not UTF-8 is one
    skipped row, not a rejected file."""
    source = tmp_path / "p.jsonl"
    source.write_bytes(
        "\ufeff".encode() + b'{"prompt": "first"}\n' + b'{"prompt": "caf\xe9"}\n' + b'{"prompt": "third"}\n'
    )
    summary = run_distill(make_cfg(prompts=str(source), num=5), target=distill_target, quiet=True)
    assert summary["records_total"] == 2 and summary["skipped"] == {"line is not UTF-8": 1}
    as_json = tmp_path / "p.json"
    as_json.write_bytes("\ufeff".encode() + json.dumps([{"prompt": "one"}]).encode())
    summary = run_distill(
        make_cfg(prompts=str(as_json), num=1, out=str(tmp_path / "j")), target=distill_target, quiet=True
    )
    assert summary["records_total"] == 1


def test_cached_features_match_a_direct_forward(distill_target, make_cfg, tmp_path):
    import torch

    from headstart.targets import forward

    source = _write(
        tmp_path / "p.jsonl", [{"prompt": "hi"}, {"prompt": "a longer question here"}, {"prompt": "third"}]
    )
    cfg = make_cfg(
        prompts=source, num=3, cache_features=True, feature_layers="0,last", feature_dtype="float16"
    )
    run_distill(cfg, target=distill_target, quiet=True)
    assert read_meta(cfg.out)["feature_layers"] == ["layer0", "last"]
    for row in load_distilled(cfg.out):
        feats = load_features(cfg.out, row)
        ref = forward(distill_target.model, torch.tensor([row["input_ids"]]), layers=[0])
        assert feats["layer0"].dtype == torch.float16 and feats["layer0"].shape == (len(row["input_ids"]), 64)
        torch.testing.assert_close(feats["layer0"].float(), ref.layers[0][0], rtol=1e-3, atol=2e-3)
        torch.testing.assert_close(feats["last"].float(), ref.last_hidden[0], rtol=1e-3, atol=2e-3)
    with pytest.raises(HeadstartError, match="max-feature-gb"):
        run_distill(
            make_cfg(
                prompts=source, num=3, out=str(tmp_path / "o2"), cache_features=True, max_feature_gb=1e-9
            ),
            target=distill_target,
            quiet=True,
        )
    with pytest.raises(HeadstartError, match="out of range"):
        run_distill(
            make_cfg(prompts=source, out=str(tmp_path / "o3"), cache_features=True, feature_layers="5"),
            target=distill_target,
            quiet=True,
        )


def test_one_writer_per_output_and_stale_temp_files_are_removed(tmp_path):
    from headstart.distill.store import data_dir, lock_output

    stale = data_dir(tmp_path) / ".tmp-shard-00000.jsonl-abcd_123"  # atomic_write_bytes's temp name
    stale.parent.mkdir(parents=True)
    stale.write_text("half")
    mine = data_dir(tmp_path) / ".tmp-my-notes"  # a user's hidden file is no leftover
    mine.write_text("mine")
    first = lock_output(tmp_path)
    assert not stale.exists() and mine.read_text() == "mine"
    with pytest.raises(HeadstartError, match="another `headstart distill`"):
        lock_output(tmp_path)
    first.close()
    lock_output(tmp_path).close()


def test_length_batches_sort_within_windows_and_keep_every_item():
    from headstart.distill.pipeline import length_batches
    from headstart.distill.plan import Item
    from headstart.distill.shapes import Conversation

    lengths = [50, 3, 40, 4, 30, 5, 9, 1]
    items = [Item(i, Conversation(("x",)), None, None, n) for i, n in enumerate(lengths)]
    batches = length_batches(items, batch_size=2, window=2)  # windows of 4 items
    assert [[it.prompt_tokens for it in b] for b in batches] == [[3, 4], [40, 50], [1, 5], [9, 30]]
    assert sorted(it.index for b in batches for it in b) == list(range(8))


def test_skip_rows_starts_later_in_the_source(distill_target, make_cfg, tmp_path):
    source = _write(tmp_path / "p.jsonl", [{"prompt": f"Question {i}"} for i in range(6)])
    summary = run_distill(make_cfg(prompts=source, num=3, skip_rows=4), target=distill_target, quiet=True)
    assert summary["records_total"] == 2 and summary["source_exhausted"]
    users = [
        m["content"]
        for row in load_distilled(tmp_path / "out")
        for m in row["messages"]
        if m["role"] == "user"
    ]
    assert users == ["Question 4", "Question 5"]


def test_min_prompt_tokens_keeps_only_the_long_rows(distill_target, make_cfg, tmp_path):
    """A long-context set from a source whose short rows another run answered: rows shorter than
    the bound are skipped and counted; the bound is a setting of the data (a run into the folder
    without it is refused), and one above --max-prompt-tokens is refused in one line."""
    rows = [{"prompt": "short"}, {"prompt": "long " * 40}, {"prompt": "tiny"}, {"prompt": "longer " * 50}]
    source = _write(tmp_path / "p.jsonl", rows)
    summary = run_distill(
        make_cfg(prompts=source, num=4, min_prompt_tokens=30), target=distill_target, quiet=True
    )
    assert summary["records_total"] == 2 and summary["skipped"] == {"too short for --min-prompt-tokens": 2}
    assert sorted(row["index"] for row in load_distilled(tmp_path / "out")) == [1, 3]
    with pytest.raises(HeadstartError, match="min_prompt_tokens|settings"):
        run_distill(make_cfg(prompts=source, num=5), target=distill_target, quiet=True)
    with pytest.raises(HeadstartError, match="--min-prompt-tokens must be in"):
        make_cfg(prompts=source, min_prompt_tokens=200, max_prompt_tokens=100)


def test_followups_make_a_self_conversation(distill_target, make_cfg, tmp_path):
    """--followups 2: after each row's own turn the target writes two more user turns (sampled with
    the data-free settings) and answers each after its own replies; only the replies are trained
    on; seeded, so a second run writes the same conversations; a setting of the data; refused for
    an engine that cannot write the user turns."""
    source = _write(
        tmp_path / "p.jsonl", [{"prompt": "Tell me about the sea."}, {"prompt": "What is two plus two?"}]
    )
    free = {"filter": False, "max_prompt_tokens": 8, "temperature": 1.0}
    summary = run_distill(
        make_cfg(prompts=source, num=2, followups=2, datafree=free), target=distill_target, quiet=True
    )
    assert summary["records_total"] == 2
    rows = load_distilled(tmp_path / "out")
    written = [row["settings"]["followups_written"] for row in rows]
    assert written == [2, 2] and not summary["skipped"]  # seeded: the same turns every run
    assert (
        summary["replies"] == 2 + 2 * 4
    )  # each row's own answer, then per follow-up: the turn and its answer
    for row in rows:
        turns = 1 + row["settings"]["followups_written"]
        users = [m["content"] for m in row["messages"] if m["role"] == "user"]
        assert len(users) == turns and users[0] in ("Tell me about the sea.", "What is two plus two?")
        ids, mask = row["input_ids"], row["loss_mask"]
        assert ids == distill_target.chat.prompt_ids(row["messages"], add_generation_prompt=False)
        runs = sum(1 for i in range(len(mask)) if mask[i] and (i + 1 == len(mask) or not mask[i + 1]))
        assert runs == turns  # the target's user turns are context, not training targets
    again = run_distill(make_cfg(prompts=source, num=2, followups=2, datafree=free, out=str(tmp_path / "o2")),
                        target=distill_target, quiet=True)  # fmt: skip
    assert again["records_total"] == 2
    by_index = {r["index"]: r["messages"] for r in rows}
    assert {r["index"]: r["messages"] for r in load_distilled(tmp_path / "o2")} == by_index
    with pytest.raises(HeadstartError, match="settings"):
        run_distill(make_cfg(prompts=source, num=3, datafree=free), target=distill_target, quiet=True)
    with pytest.raises(HeadstartError, match="--followups needs --engine headstart"):
        make_cfg(prompts=source, followups=1, engine="generate")


def test_documents_make_long_document_tasks(distill_target, make_cfg, tmp_path):
    """--documents N: the target first writes a document of up to N tokens on each row's turn
    (a genre picked per row), then the turn it is trained on is that document and a task about it;
    only the reply is trained on; seeded, so a second run writes the same conversations; bound to
    the output's settings; refused for an engine that cannot write the documents."""
    from headstart.distill.documents import GENRES, TASKS, instruction, pick

    source = _write(tmp_path / "p.jsonl", [{"prompt": "The history of the sea."}, {"prompt": "Bridges."}])
    free = {"filter": False, "temperature": 1.0}
    summary = run_distill(make_cfg(prompts=source, num=2, documents=24, datafree=free), target=distill_target,
                          quiet=True)  # fmt: skip
    assert summary["records_total"] == 2 and summary["replies"] == 2 * 2  # each row: its document, its answer
    rows = load_distilled(tmp_path / "out")
    for row in rows:
        genre, task = pick(0, row["index"])
        assert genre in GENRES and task in TASKS and row["settings"]["documents"] == 24
        users = [m["content"] for m in row["messages"] if m["role"] == "user"]
        assert len(users) == 1 and users[0].endswith("\n\n" + task) and len(users[0]) > len(task) + 2
        assert "Write a" not in users[0]  # the instruction that wrote the document is not in the record
        ids, mask = row["input_ids"], row["loss_mask"]
        assert ids == distill_target.chat.prompt_ids(row["messages"], add_generation_prompt=False)
        runs = sum(1 for i in range(len(mask)) if mask[i] and (i + 1 == len(mask) or not mask[i + 1]))
        assert runs == 1  # the document is context, not a training target
    assert instruction("news article", "Bridges.", 24).endswith("\n\nBridges.")
    again = run_distill(make_cfg(prompts=source, num=2, documents=24, datafree=free, out=str(tmp_path / "o2")),
                        target=distill_target, quiet=True)  # fmt: skip
    assert again["records_total"] == 2
    assert {r["index"]: r["messages"] for r in load_distilled(tmp_path / "o2")} == {
        r["index"]: r["messages"] for r in rows
    }
    with pytest.raises(HeadstartError, match="settings"):
        run_distill(
            make_cfg(prompts=source, num=3, documents=32, datafree=free), target=distill_target, quiet=True
        )
    with pytest.raises(HeadstartError, match="--documents needs --engine headstart"):
        make_cfg(prompts=source, documents=16, engine="generate")


def test_engines_write_the_same_greedy_conversations(distill_target, make_cfg, tmp_path):
    """Continuous batching (the default) and transformers' generate answer every turn of
    multi-turn rows alike; the record says which engine wrote it."""
    rows = (
        SHAPED_ROWS["sharegpt"] + SHAPED_ROWS["mtbench"] + [{"prompt": f"q {i} " * (1 + i)} for i in range(5)]
    )
    source = _write(tmp_path / "p.jsonl", rows)
    records = {}
    for engine in ("headstart", "generate"):
        cfg = make_cfg(prompts=source, num=len(rows), out=str(tmp_path / engine), engine=engine, batch_size=3)
        summary = run_distill(cfg, target=distill_target, quiet=True)
        assert summary["records_total"] == len(rows) and summary["replies"] == len(rows) + 2
        records[engine] = sorted(load_distilled(cfg.out), key=lambda r: r["index"])
        assert {r["settings"]["engine"] for r in records[engine]} == {engine}
    assert [r["input_ids"] for r in records["headstart"]] == [r["input_ids"] for r in records["generate"]]
    assert [r["messages"] for r in records["headstart"]] == [r["messages"] for r in records["generate"]]


def test_dataset_engine_trains_on_the_rows_own_replies(distill_target, make_cfg, tmp_path):
    """--engine dataset: no generation; ShareGPT, OpenAI-messages, UltraChat and Alpaca rows keep
    their own assistant turns, rendered by the target's template, loss mask on assistant tokens."""
    rows = [
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"},
                           {"from": "human", "value": "More"}, {"from": "gpt", "value": "Sure."}]},
        {"messages": [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "2+2?"},
                      {"role": "assistant", "content": "4"}]},
        {"data": ["Name a colour", "Blue", "Another", "Red"]},
        {"instruction": "Add", "input": "1 2", "output": "3"},
        {"conversations": [{"from": "human", "value": "no answer here"}]},
        {"data": ["First", "One", "Second"]},  # the last turn has no reply: the record keeps one turn
    ]  # fmt: skip
    source = _write(tmp_path / "p.jsonl", rows)
    cfg = make_cfg(prompts=source, num=len(rows), engine="dataset", max_new_tokens=6)
    summary = run_distill(cfg, target=distill_target, quiet=True)
    assert summary["records_total"] == 5
    assert summary["skipped"] == {
        "no reply in the data": 1,
        "turns without a reply in the data (conversation cut)": 1,
    }
    data = {r["index"]: r for r in load_distilled(cfg.out)}
    replies = {i: [m["content"] for m in r["messages"] if m["role"] == "assistant"] for i, r in data.items()}
    assert replies == {0: ["Hello!", "Sure."], 1: ["4"], 2: ["Blue", "Red"], 3: ["3"], 5: ["One"]}
    tok = distill_target.tokenizer
    for record in data.values():
        masked = tok.decode([t for t, m in zip(record["input_ids"], record["loss_mask"], strict=True) if m])
        assert masked == "".join(f"{r}<|im_end|>" for r in replies[record["index"]])
        assert record["settings"]["engine"] == "dataset"
    # the data's replies and the target's never share an output directory
    with pytest.raises(HeadstartError, match="settings"):
        run_distill(make_cfg(prompts=source, num=len(rows)), target=distill_target, quiet=True)


def test_features_beyond_float16_are_refused_not_stored_as_inf():
    """Gemma's residual stream passes 65504: float16 would store inf and training would give NaN."""
    import torch

    from headstart.distill.features import check_representable

    big = torch.tensor([[1.0, 7.0e4]])
    with pytest.raises(HeadstartError, match=r"layer8 reaches \|x\| = 7e\+04.*--feature-dtype bfloat16"):
        check_representable(big.half(), big, "layer8", "float16")
    check_representable(big.bfloat16(), big, "layer8", "bfloat16")  # bfloat16 has float32's range


@pytest.mark.parametrize("features", [False, True])
def test_shards_hold_shard_size_records_and_progress_counts_records(
    distill_target, make_cfg, tmp_path, monkeypatch, features
):
    """--num 6 --shard-size 2 at a batch of 64: three shards of two (before: one shard of six),
    and the bar advances per finished record (before: it sat at 0/6 until the end)."""
    import tqdm.auto

    from headstart.distill.store import shard_paths

    source = tmp_path / "p.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(6)))
    steps = []
    real = tqdm.auto.tqdm

    class Counting(real):
        def __init__(self, *args, **kwargs):
            self.label = kwargs.get("desc")
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            if self.label == "distill":
                steps.append(n)
            return super().update(n)

    monkeypatch.setattr(tqdm.auto, "tqdm", Counting)
    extra = dict(cache_features=True, feature_layers="last") if features else {}
    cfg = make_cfg(prompts=str(source), num=6, shard_size=2, batch_size=64, **extra)
    assert run_distill(cfg, target=distill_target, quiet=True)["records_total"] == 6
    sizes = [len(path.read_text().splitlines()) for path in shard_paths(cfg.out)]
    assert sizes == [2, 2, 2]
    assert steps == [1] * 6
    shards = {
        path.stem: [json.loads(line) for line in path.read_text().splitlines()]
        for path in shard_paths(cfg.out)
    }
    assert sorted(r["index"] for rows in shards.values() for r in rows) == list(range(6))
    if features:  # each record's features sit in its own shard's file
        for stem, rows in shards.items():
            for record in rows:
                assert record["features_file"] == f"features/{stem}.safetensors"
                assert load_features(cfg.out, record)["last"].shape[0] == len(record["input_ids"])
