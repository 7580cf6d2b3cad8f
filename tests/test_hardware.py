"""Sharing the machine (headstart.hardware.share_machine): the thread count from the cores no other
process keeps busy and passive waiting under load, decided from an injected load (the rule), and
from a real one only where the outcome cannot depend on how busy the machine already is."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from headstart.hardware import BUSY_CORE, other_load, physical_cores, share_machine, usable_cores


def test_an_idle_machine_keeps_torchs_own_choice():
    env: dict[str, str] = {}
    sharing = share_machine(env, busy=0.0)
    assert env == {} and not sharing.passive and sharing.threads == min(usable_cores(), physical_cores())
    assert sharing.note() == ""


@pytest.mark.skipif(min(usable_cores(), physical_cores()) < 2, reason="needs 2 cores")
@pytest.mark.parametrize("busy", [1.0, 1.4])
def test_a_busy_core_is_left_to_its_process_and_threads_wait_passively(busy):
    env: dict[str, str] = {}
    sharing = share_machine(env, busy=busy)
    cores = min(usable_cores(), physical_cores())
    assert env == {"OMP_NUM_THREADS": str(cores - 1), "OMP_WAIT_POLICY": "PASSIVE"}
    assert sharing.passive and sharing.threads == cores - 1 and "--threads N" in sharing.note()


def test_a_whole_machine_busy_still_leaves_one_thread():
    env: dict[str, str] = {}
    assert share_machine(env, busy=float(usable_cores())).threads == 1 and env["OMP_NUM_THREADS"] == "1"


def test_a_little_load_takes_no_core():
    env: dict[str, str] = {}
    sharing = share_machine(env, busy=BUSY_CORE / 2)
    assert env == {} and not sharing.passive


def test_the_users_settings_win():
    env = {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "ACTIVE"}
    sharing = share_machine(env, busy=1.0)
    assert env == {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "ACTIVE"}
    assert sharing.threads is None and not sharing.passive
    env = {}
    sharing = share_machine(env, busy=1.0, threads_given=True)  # the command's --threads
    assert "OMP_NUM_THREADS" not in env and sharing.passive and "the threads you set" in sharing.note()


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc/stat")
def test_a_spinning_process_is_seen():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert other_load(usable_cores(), sample_s=0.3) >= BUSY_CORE
    finally:
        busy.kill()
        busy.wait()


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc/stat")
def test_the_command_line_says_what_it_chose_on_a_busy_machine(tiny_llama, tmp_path):
    """The `headstart` executable (cli.console) with another process spinning: a note on stderr,
    and HEADSTART_SHARE_MACHINE=0 turns the choice off."""
    args = [sys.executable, "-m", "headstart", "generate", "--target", str(tiny_llama), "--no-heads", "--prompt",
            "hi", "--max-new-tokens", "2"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        said = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
        off = subprocess.run(args, env=env | {"HEADSTART_SHARE_MACHINE": "0"}, capture_output=True, text=True,
                             timeout=300)  # fmt: skip
    finally:
        busy.kill()
        busy.wait()
    assert said.returncode == 0 and "note: other processes keep" in said.stderr, said.stderr[-2000:]
    assert off.returncode == 0 and "note: other processes keep" not in off.stderr
