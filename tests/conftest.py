from __future__ import annotations

import os
import signal
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests check the small-row kernel's numbers wherever decoders may take it (1-64 rows), whatever
# row range calibration picks for speed on this CPU (tests/targets/test_smallmm.py tests that).
os.environ.setdefault("HEADSTART_SMALLMM_ROWS", "64")
# Calibration verdicts (headstart/calibration.py) of the tests' tiny heads go to a folder of this
# session, never the user's cache (subprocesses inherit it).
os.environ.setdefault("HEADSTART_CALIBRATION_CACHE", tempfile.mkdtemp(prefix="headstart-test-calibration-"))
# A suite run beside another job shares the machine as the CLI does (headstart.cli.console): fewer
# threads and passive waiting when another process keeps a core busy, set before torch is imported
# (its OpenMP runtime reads them once): spinning threads made such runs 3-5x slower.
if "torch" not in sys.modules:
    from headstart.hardware import share_machine

    share_machine()

from tiny import make_target_dir  # noqa: E402

# A suite started in the background of a non-interactive shell (nohup, `cmd &`) inherits SIGINT
# ignored, and Python then keeps it ignored: the tests of Ctrl-C handling would fail there only.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny-targets")


@pytest.fixture(scope="session")
def tiny_llama(tiny_root) -> Path:
    return make_target_dir(tiny_root, "llama")


@pytest.fixture
def slow_plain(monkeypatch):
    """Plain decoding (the timing's reference, inference.timing.LeanPlain) timed 1 s slower a call,
    and the cost bound set to nothing, so that random heads on a tiny model beat it and `headstart
    tune` stores their best tree (tune refuses to store a tree whose tau cannot pay for its verify,
    or slower than plain decoding: tests/bench/test_tune.py shows that)."""
    from headstart.inference import timing

    monkeypatch.setattr(timing, "tau_floor", lambda *_: 0.0)

    faster = timing.LeanPlain.generate

    def slower(self, *args, **kwargs):
        result = faster(self, *args, **kwargs)
        result.stats.wall_s += 1.0
        return result

    monkeypatch.setattr(timing.LeanPlain, "generate", slower)
