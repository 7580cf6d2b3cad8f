"""`headstart serve --record DIR`: every finished reply, as the target produced it (token ids),
kept as a data set `headstart train` reads as `data.path` (distill's layout: distill_meta.json,
data/shard-*.jsonl with input_ids and loss_mask, the reply's tokens the only ones trained on).

Opt-in, and private: the folder is 0700 and its files 0600; a record holds token ids, the finish
reason, the lane's sampling setting and a time, never text, headers or API keys.

Durability: a reply is one line appended to DIR/.journal.jsonl and fsynced before its client
is told it is done (one disk sync for all the replies a decode step finished), so a kill -9
loses no finished reply. Every
`shard_size` replies, at shutdown and at the next start, the journal's complete lines are
published as the next shard (written aside, fsynced, renamed: a reader never sees half of one) and
the journal is emptied. A torn last line (the process died in the write, before its client heard)
is dropped; records carry a sequence number, so dying between publishing and emptying the journal
publishes no reply twice. Past `max_bytes` on disk recording stops, said once: the server goes on.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from headstart.distill.store import (
    META,
    atomic_write_bytes,
    data_dir,
    lock_output,
    open_output,
    read_meta,
    shard_paths,
)
from headstart.errors import HeadstartError

log = logging.getLogger("headstart.serve")

JOURNAL = ".journal.jsonl"
SOURCE = "headstart serve --record"
SETTINGS = {"prompts": "served-traffic", "source": SOURCE}
"""The meta's settings: train names the data "served-traffic"; a distilled folder is refused."""


class Recorder:
    """The record folder of one server process (an exclusive lock: one writer at a time)."""

    def __init__(self, folder: str | Path, target: Any, max_bytes: int, shard_size: int = 256) -> None:
        self.folder = Path(folder)
        self.max_bytes, self.shard_size = max_bytes, shard_size
        if (self.folder / META).is_file() and (read_meta(self.folder).get("settings") or {}).get(
            "source"
        ) != SOURCE:
            raise HeadstartError(
                f"--record {folder} is a distilled data set, not a folder of recorded replies",
                "record into a new folder (train reads several: data.path=[distilled,recorded])",
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        open_output(
            self.folder, {"fingerprint": target.fingerprint, "settings": SETTINGS, "feature_layers": None}
        )
        os.chmod(self.folder / META, 0o600)
        self.lock = lock_output(self.folder, SOURCE)  # a second server on the same folder is refused here
        self.next_index = self._published_end()
        self.journal = self.folder / JOURNAL
        self.fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.chmod(self.journal, 0o600)
        self.unpublished = 0
        self.publish()  # what a killed server left in the journal
        self.bytes = sum(p.stat().st_size for p in self.folder.rglob("*") if p.is_file())
        self.stopped = False
        self.recorded = 0  # replies this process recorded

    # ---- writing --------------------------------------------------------------------------------
    def add(
        self, prompt: list[int], reply: list[int], finish: str, sampling: tuple[float, float, int]
    ) -> None:
        """Append one finished reply (`add_many` of one)."""
        self.add_many([(prompt, reply, finish, sampling)])

    def add_many(self, replies: list[tuple[list[int], list[int], str, tuple[float, float, int]]]) -> None:
        """Append finished replies (each: its prompt as the target saw it, its tokens as the target
        wrote them, the end-of-sequence token included, why it ended, the lane's sampling) and make
        them durable with ONE fsync (a decode step's finished replies together: cost one disk sync
        a step, not a reply). Never raises: a recording that fails (disk full, folder removed)
        stops, said once, and the server goes on."""
        if self.stopped:
            return
        lines: list[bytes] = []
        for prompt, reply, finish, (temperature, top_p, top_k) in replies:
            if not reply:
                continue
            record = {
                "index": self.next_index + self.unpublished + len(lines),
                "input_ids": [*prompt, *reply],
                "loss_mask": [0] * len(prompt) + [1] * len(reply),
                "reply_tokens": len(reply),
                "finish": finish,
                "sampling": {"temperature": temperature, "top_p": top_p, "top_k": top_k},
                "recorded_at": int(time.time()),
            }
            line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
            if self.bytes + sum(map(len, lines)) + len(line) > self.max_bytes:
                self._stop(f"the folder reached --record-max-mb ({self.max_bytes / 2**20:.0f} MiB)")
                break
            lines.append(line)
        if not lines:
            return
        try:
            view = memoryview(b"".join(lines))
            while view:
                view = view[os.write(self.fd, view) :]
            os.fsync(self.fd)
            self.bytes += sum(map(len, lines))
            self.unpublished += len(lines)
            self.recorded += len(lines)
            if self.unpublished >= self.shard_size:
                self.publish()
        except OSError as err:
            self._stop(f"writing failed ({err.strerror or err})")

    def publish(self) -> None:
        """The journal's complete, unpublished lines as the next shard, then an empty journal."""
        records = self._journal_records()
        if records:
            number = max((int(p.stem.split("-")[1]) for p in shard_paths(self.folder)), default=-1) + 1
            path = data_dir(self.folder) / f"shard-{number:05d}.jsonl"
            atomic_write_bytes(path, b"".join(records), private=True)
            self.next_index += len(records)
        os.ftruncate(self.fd, 0)  # after the rename: a crash before it leaves lines the next start skips
        os.fsync(self.fd)
        self.unpublished = 0

    def close(self) -> None:
        try:
            self.publish()
        except OSError as err:
            log.warning("warning: --record %s: publishing the last replies failed (%s); they stay in %s "
                        "and are published at the next start", self.folder, err, JOURNAL)  # fmt: skip
        os.close(self.fd)
        self.lock.close()

    # ---- reading back ---------------------------------------------------------------------------
    def _journal_records(self) -> list[bytes]:
        """Complete journal lines not yet in a shard (a torn last line is dropped)."""
        kept = []
        for line in self.journal.read_bytes().splitlines(keepends=True):
            if not line.endswith(b"\n"):
                log.warning("warning: --record %s: dropped a reply cut short by a crash", self.folder)
                break
            try:
                index = int(json.loads(line)["index"])
            except (ValueError, KeyError, TypeError):
                log.warning("warning: --record %s: dropped a damaged journal line", self.folder)
                continue
            if index >= self.next_index:
                kept.append(line)
        return kept

    def _published_end(self) -> int:
        """One past the last published record's index (0 for none)."""
        end = 0
        for path in shard_paths(self.folder):
            lines = path.read_bytes().splitlines()
            if lines:
                try:
                    end = max(end, int(json.loads(lines[-1])["index"]) + 1)
                except (ValueError, KeyError, TypeError):
                    raise HeadstartError(
                        f"{path} is damaged, so --record cannot tell which replies it holds",
                        f"move {path.name} away, or record into a new folder",
                    ) from None
        return end

    def _stop(self, why: str) -> None:
        self.stopped = True
        log.warning("warning: --record %s: recording stopped: %s; %d replies kept", self.folder, why,
                    self.next_index + self.unpublished)  # fmt: skip
