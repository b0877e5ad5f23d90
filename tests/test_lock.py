"""One writer per output directory (:mod:`icl_ssm.lock`): a second process is refused at once with
the holder's pid, a lock left by a killed process is taken over with a message, and a command on a
held --out stops before it writes anything."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from icl_ssm.cli import main
from icl_ssm.lock import LOCK, one_writer

HOLD = ("import sys, time; from icl_ssm.lock import one_writer\n"
        "with one_writer(sys.argv[1], 'icl-ssm run'):\n"
        "    print('held', flush=True); time.sleep(60)\n")


def holder(out):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_at_once_and_a_killed_one_s_lock_is_taken_over(tmp_path):
    proc = holder(tmp_path)
    try:
        t0 = time.perf_counter()
        with pytest.raises(ValueError, match=rf"being written by another icl-ssm process \(pid {proc.pid}, "
                                             r"icl-ssm run, started \d{4}-\d\d-\d\d"):
            with one_writer(tmp_path, "icl-ssm answer"):
                pass
        assert time.perf_counter() - t0 < 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    said = []
    with one_writer(tmp_path, "icl-ssm answer", say=said.append):
        assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    assert len(said) == 1 and f"took over the lock left by a process that is no longer running (pid {proc.pid}" \
        in said[0]
    assert (tmp_path / LOCK).read_text() == ""  # a clean exit leaves no holder
    with one_writer(tmp_path, "icl-ssm run", say=said.append):
        pass
    assert len(said) == 1  # nothing to take over after a clean exit


def test_a_command_on_a_held_out_stops_before_writing(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    proc = holder(out)
    try:
        code = main(["run", "--model", "tiny-llama", "--task", "coin_flip", "--out", str(out)])
        assert code == 2 and f"pid {proc.pid}" in capsys.readouterr().err
        assert sorted(p.name for p in out.iterdir()) == [LOCK]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_the_next_writer_removes_the_temporary_files_a_killed_run_left(tmp_path):
    from icl_ssm.lock import one_writer

    (tmp_path / "stages").mkdir()
    stale = [tmp_path / ".accuracy.png.upv84qlp.tmp", tmp_path / "stages" / ".check.json.abc.tmp"]
    for p in stale:
        p.write_bytes(b"half a file")
    keep = tmp_path / "report.json"
    keep.write_text("{}")
    heard = []
    with one_writer(tmp_path, "icl-ssm run", say=heard.append):
        assert not any(p.exists() for p in stale) and keep.exists()
    assert heard and "removed 2 unfinished temporary file(s)" in heard[0] and ".accuracy.png.upv84qlp.tmp" in heard[0]
