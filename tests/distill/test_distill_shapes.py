"""Prompt sources and row shapes: every supported shape, bad rows counted, bad files refused."""

from __future__ import annotations

import json

import pytest

from headstart.distill.shapes import Conversation, Skip, to_conversation
from headstart.distill.sources import BadRow, read_rows
from headstart.errors import HeadstartError

ROWS = {
    "sharegpt": {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "old"},
            {"from": "human", "value": "More"},
        ]
    },
    "messages": {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "old"},
            {"role": "user", "content": "More"},
        ]
    },
    "alpaca": {"instruction": "Sum these", "input": "1 2", "output": "3"},
    "mtbench": {"turns": ["Hi", "More"]},
    "prompt": {"prompt": "Hi"},
    "text": {"text": "Hi"},
}


def test_every_shape_is_detected_with_its_user_turns_and_own_replies():
    assert to_conversation(ROWS["sharegpt"]) == Conversation(("Hi", "More"), "Be brief.", ("old", None))
    assert to_conversation(ROWS["messages"]) == Conversation(("Hi", "More"), None, ("old", None))
    assert to_conversation(ROWS["alpaca"]) == Conversation(("Sum these\n\n1 2",), None, ("3",))
    assert to_conversation({"instruction": "Do it", "input": ""}) == Conversation(("Do it",), None, (None,))
    assert to_conversation({"data": ["a", "b", "c"]}) == Conversation(("a", "c"), None, ("b", None))
    assert to_conversation(ROWS["mtbench"]) == Conversation(("Hi", "More"))
    assert to_conversation(ROWS["prompt"]) == Conversation(("Hi",))
    assert to_conversation(ROWS["text"]) == Conversation(("Hi",))


def test_shape_override_and_field_mapping():
    row = {"text": "from text", "prompt": "from prompt"}
    assert to_conversation(row).turns == ("from prompt",)
    assert to_conversation(row, shape="text").turns == ("from text",)
    assert to_conversation({"question": "Q?", "answer": "A"}, field="question").turns == ("Q?",)
    assert to_conversation({"dialog": [{"from": "human", "value": "x"}]}, field="dialog").turns == ("x",)
    assert to_conversation({"qs": ["a", "b"]}, field="qs").turns == ("a", "b")


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"foo": 1}, "unknown row shape"),
        ({"prompt": "   "}, "empty turn"),
        ({"prompt": 3}, "non-string turn"),
        ({"turns": []}, "empty conversation"),
        ({"turns": ["ok", None]}, "non-string turn"),
        ({"conversations": [{"from": "gpt", "value": "only a reply"}]}, "no user turn"),
        ({"messages": ["not a dict"]}, "malformed turn"),
        ({"prompt": "hello \ud800 friend"}, "not valid Unicode (a lone surrogate)"),  # valid JSON
    ],
)
def test_bad_rows_raise_skip_with_a_reason(row, reason):
    with pytest.raises(Skip) as info:
        to_conversation(row)
    assert info.value.reason == reason


def test_read_rows_json_jsonl_parquet_and_malformed_lines(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.json").write_text(json.dumps([{"prompt": "x"}, 5, {"prompt": "y"}]))
    rows = list(read_rows(str(tmp_path / "a.json")))
    assert [i for i, _ in rows] == [0, 1, 2] and isinstance(rows[1][1], BadRow)
    (tmp_path / "wrapped.json").write_text(json.dumps({"data": [{"prompt": "x"}]}))
    assert list(read_rows(str(tmp_path / "wrapped.json"))) == [(0, {"prompt": "x"})]
    (tmp_path / "b.jsonl").write_text('{"prompt": "x"}\n{broken\n\n[1]\n{"prompt": "y"}\n')
    rows = list(read_rows(str(tmp_path / "b.jsonl")))
    assert [r.reason if isinstance(r, BadRow) else r["prompt"] for _, r in rows] == [
        "x",
        "malformed JSON line",
        "row is not an object",
        "y",
    ]
    pq.write_table(pa.Table.from_pylist([{"text": "p"}, {"text": "q"}]), tmp_path / "c.parquet")
    assert [r["text"] for _, r in read_rows(str(tmp_path / "c.parquet"))] == ["p", "q"]


def test_unreadable_sources_fail_clearly(tmp_path):
    (tmp_path / "bad.json").write_text("[{not json")
    with pytest.raises(HeadstartError, match="not valid JSON"):
        list(read_rows(str(tmp_path / "bad.json")))
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(HeadstartError, match="Parquet"):
        list(read_rows(str(tmp_path / "bad.parquet")))
    with pytest.raises(HeadstartError, match="not found"):
        list(read_rows(str(tmp_path / "missing.jsonl")))
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(HeadstartError, match="unknown prompt file type"):
        list(read_rows(str(tmp_path / "x.csv")))


def test_local_dataset_directory_goes_through_datasets(tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(3)))
    assert [r["prompt"] for _, r in read_rows(str(folder), split="train")] == ["p0", "p1", "p2"]
    with pytest.raises(HeadstartError, match="split"):
        list(read_rows(str(folder), split="nope"))
