"""`headstart serve --record DIR` (serve/record.py): every finished reply kept as the target wrote
it, in a folder `headstart train` reads; private; durable through kill -9 with no half-written
file; no reply twice after a crash at any point; a size cap that stops recording, not serving."""

from __future__ import annotations

import json
import os
import signal
import stat

import pytest
from serving import Server, http

from headstart.distill.store import load_distilled, shard_paths
from headstart.errors import HeadstartError
from headstart.serve.record import JOURNAL, Recorder
from headstart.targets import load_target


@pytest.fixture(scope="module")
def target(tiny_llama):
    return load_target(str(tiny_llama))


def replies(folder) -> list[list[int]]:
    """Each published record's reply tokens, in order."""
    rows = load_distilled(folder)
    return [ids[len(ids) - n :] for ids, n in zip(rows["input_ids"], rows["reply_tokens"], strict=True)]


def test_replies_are_kept_for_training_and_private(target, tmp_path):
    folder = tmp_path / "rec"
    recorder = Recorder(folder, target, max_bytes=2**20, shard_size=2)
    for i in range(5):
        recorder.add([1, 2, 3 + i], [7, 8 + i, 2], "stop", (0.0, 1.0, 0))
    recorder.close()
    assert len(shard_paths(folder)) == 3  # 2 + 2 published as they filled, the last at close
    assert replies(folder) == [[7, 8 + i, 2] for i in range(5)]
    rows = load_distilled(folder)
    assert rows["loss_mask"][0] == [0, 0, 0, 1, 1, 1] and list(rows["index"]) == list(range(5))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for path in [p for p in folder.rglob("*") if p.is_file() and p.name != ".lock"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # what train reads: input_ids and loss_mask, the target's fingerprint, the source named
    from headstart.train.config import DataConfig
    from headstart.train.data import load_distilled_data

    data = load_distilled_data(DataConfig(path=[str(folder)]))
    assert len(data) == 5 and data.fingerprint == target.fingerprint and data.sources == ["served-traffic"]
    # a restart appends after them
    again = Recorder(folder, target, max_bytes=2**20)
    again.add([4], [5, 2], "length", (0.7, 0.9, 0))
    again.close()
    assert replies(folder)[-1] == [5, 2] and list(load_distilled(folder)["index"]) == list(range(6))


def test_a_crash_at_any_point_loses_no_finished_reply_and_repeats_none(target, tmp_path):
    folder = tmp_path / "rec"
    first = Recorder(folder, target, max_bytes=2**20, shard_size=100)
    for i in range(3):
        first.add([1], [10 + i], "stop", (0.0, 1.0, 0))
    # killed: the three replies are only in the journal, the last line torn mid-write (a fourth
    # reply whose client never heard), and the process's lock died with it
    os.write(first.fd, b'{"index":3,"input_ids":[1,')
    os.close(first.fd)
    first.lock.close()
    second = Recorder(folder, target, max_bytes=2**20)
    assert replies(folder) == [[10], [11], [12]] and (folder / JOURNAL).stat().st_size == 0
    # killed between publishing a shard and emptying the journal: the next start repeats nothing
    second.add([1], [13], "stop", (0.0, 1.0, 0))
    journal = (folder / JOURNAL).read_bytes()
    second.publish()
    os.write(second.fd, journal)
    os.close(second.fd)
    second.lock.close()
    Recorder(folder, target, max_bytes=2**20).close()
    assert replies(folder) == [[10], [11], [12], [13]]
    assert not [p for p in folder.rglob(".tmp-*")]


def test_the_size_cap_stops_recording_not_serving(target, tmp_path, caplog):
    recorder = Recorder(tmp_path / "rec", target, max_bytes=1200)
    for _ in range(40):
        recorder.add([1] * 20, [5] * 20, "stop", (0.0, 1.0, 0))  # ~150 bytes a line
    assert recorder.stopped and 1 <= recorder.recorded < 10
    assert "recording stopped" in caplog.text and "--record-max-mb" in caplog.text
    recorder.close()
    assert sum(p.stat().st_size for p in (tmp_path / "rec").rglob("*") if p.is_file()) <= 1200


def test_a_distilled_folder_or_a_second_server_is_refused(target, tmp_path):
    distilled = tmp_path / "distilled"
    distilled.mkdir()
    (distilled / "distill_meta.json").write_text(
        json.dumps({"fingerprint": {}, "settings": {"prompts": "x"}})
    )
    with pytest.raises(HeadstartError, match="is a distilled data set, not a folder of recorded replies"):
        Recorder(distilled, target, max_bytes=2**20)
    held = Recorder(tmp_path / "rec", target, max_bytes=2**20)
    with pytest.raises(HeadstartError, match="another `headstart serve --record` is writing"):
        Recorder(tmp_path / "rec", target, max_bytes=2**20)
    held.close()


def chat(server: Server, content: str, key: str) -> dict:
    import urllib.request

    body = json.dumps({"model": server.model, "messages": [{"role": "user", "content": content}],
                       "max_tokens": 12, "temperature": 0}).encode()  # fmt: skip
    request = urllib.request.Request(f"{server.url}/v1/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


def test_serve_records_what_the_clients_received_through_kill_9(tiny_llama, heads, target, tmp_path):
    """End to end: the recorded replies decode to the texts the clients received; a kill -9 right
    after loses none and leaves no half-written file; train reads the folder; without --record the
    server writes no record anywhere."""
    folder = tmp_path / "rec"
    key = "sk-secret-key-do-not-record"
    server = Server(tiny_llama, heads, tmp_path, "--record", str(folder), "--api-key", key)
    texts = [chat(server, prompt, key)["choices"][0]["message"]["content"] for prompt in
             ("hello there", "What is the capital of France?", "Write a poem about the sea")]  # fmt: skip
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(timeout=30)
    server.log.close()
    assert not shard_paths(folder)  # all three only in the journal (a shard is 256 replies)
    Recorder(folder, target, max_bytes=2**20).close()  # what the next start does first
    got = replies(folder)
    assert len(got) == 3
    decoded = [target.tokenizer.decode([t for t in ids if t not in target.eos_token_ids]) for ids in got]
    assert decoded == texts
    for path in folder.rglob("*"):
        assert not path.name.startswith(".tmp-")
        if path.is_file():
            assert key.encode() not in path.read_bytes() and b"Bearer" not in path.read_bytes()
    assert (folder / JOURNAL).stat().st_size == 0
    (tmp_path / "plain").mkdir()
    plain = Server(tiny_llama, heads, tmp_path / "plain", "--api-key", key)
    chat(plain, "hello there", key)
    assert http("GET", f"{plain.url}/health")[0] == 200
    assert plain.stop() == 0
    assert not list((tmp_path / "plain").rglob("*.jsonl"))


def test_a_steps_replies_are_made_durable_together(target, tmp_path, monkeypatch):
    """The replies a decode step finished go to disk with one fsync, not one each."""
    syncs = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: syncs.append(fd) or real(fd))
    recorder = Recorder(tmp_path / "rec", target, max_bytes=2**20)
    syncs.clear()
    recorder.add_many([([1], [2 + i], "stop", (0.0, 1.0, 0)) for i in range(5)])
    assert len(syncs) == 1 and recorder.recorded == 5
    recorder.close()
    assert replies(tmp_path / "rec") == [[2 + i] for i in range(5)]
