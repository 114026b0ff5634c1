"""Logs that never end or inflate without bound: refused fast and small, in one line, never read twice.

Real parts: /dev/zero itself, a real pipe from it, a pod-log link to it, real gzip files, and a CRI file a
real process keeps appending to while it is read. Each run has a hang guard (a timeout far above what the
command needs), never a timing assertion."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, SEED_LOG, run_cli

GUARD_S = 120  # a hang, not a speed, fails the test


def _cli(argv, stdin=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "kvforensics"] + argv, stdin=stdin, capture_output=True, text=True,
                          timeout=GUARD_S, env=env, cwd=str(ROOT))


def test_a_character_device_is_refused_before_reading():
    code, out, err = run_cli(["analyze", "/dev/zero"])
    assert (code, out) == (2, "")
    assert err.strip() == ("kvforensics: error: /dev/zero: is a character device, not a log file (kvforensics reads "
                           "files, pipes and stdin)")


def test_a_pod_log_that_links_to_dev_zero_is_refused(tmp_path):
    from kvforensics.collectors.logfile import LogReadError, read_log

    link = tmp_path / "0.log"
    link.symlink_to("/dev/zero")
    with pytest.raises(LogReadError, match="is a character device"):
        read_log(str(link))


def test_an_endless_stream_of_nul_bytes_is_refused_at_once():
    with open("/dev/zero", "rb") as zero:
        done = _cli(["analyze", "-"], stdin=zero)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == "kvforensics: error: <stdin>: this is not a text log (it begins with NUL bytes)"


def test_a_gz_of_zeros_is_refused_without_inflating_it(tmp_path):
    bomb = tmp_path / "server.log.1.gz"
    with gzip.open(str(bomb), "wb", compresslevel=9) as f:
        block = b"\0" * (1 << 20)
        for _ in range(1024):  # 1 GiB of zeros in about 1 MiB
            f.write(block)
    done = _cli(["analyze", str(bomb)])
    assert done.returncode == 2 and "this is not a text log (it begins with NUL bytes)" in done.stderr


def test_a_gz_that_inflates_past_its_cap_is_a_bomb_and_its_verdict_is_kept(tmp_path, monkeypatch):
    from kvforensics.collectors import logfile

    bomb = tmp_path / "server.log.2.gz"
    with gzip.open(str(bomb), "wb", compresslevel=9) as f:
        f.write(b"INFO nothing to see here\n" * (400 << 10))  # 10 MiB of text in a few KiB
    monkeypatch.setattr(logfile, "MIN_INFLATE_CAP", 1 << 20)
    with pytest.raises(logfile.LogReadError) as first:
        logfile.read_log(str(bomb))
    assert first.value.code == "bomb" and str(first.value).startswith(str(bomb) + ": this .gz inflates past ")

    def never(*args, **kwargs):
        raise AssertionError("a refused file was inflated again")

    monkeypatch.setattr(logfile, "_Gunzip", never)
    with pytest.raises(logfile.LogReadError) as again:
        logfile.read_log(str(bomb))
    assert str(again.value) == str(first.value)
    os.utime(str(bomb), ns=(time.time_ns(), time.time_ns() + 10**9))  # a new version is read anew
    with pytest.raises(AssertionError, match="inflated again"):
        logfile.read_log(str(bomb))


def test_a_cri_file_that_keeps_growing_is_read_as_it_was_when_opened(tmp_path):
    """The seed's startup as a CRI file, and a real process appending throughput records to it as fast as it
    can for as long as the guard allows: the read ends at the size the file had when it was opened."""
    lines = SEED_LOG.read_text(encoding="utf-8").splitlines()
    cri = tmp_path / "0.log"
    cri.write_text("".join("2026-05-01T10:00:00.{:09d}Z stdout F {}\n".format(i, x) for i, x in enumerate(lines)),
                   encoding="utf-8")
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "rec = b'2026-05-01T11:00:00.000000000Z stdout F [2026-05-01 11:00:00 TP0] Decode batch. #running-req: 1\\n'\n"
        "end = time.time() + {}\n"
        "with open(sys.argv[1], 'ab', buffering=1 << 20) as f:\n"
        "    while time.time() < end:\n"
        "        f.write(rec * 4096)\n").format(GUARD_S), str(cri)])
    try:
        while cri.stat().st_size < 16 << 20:  # the runtime is well ahead before the read starts
            time.sleep(0.05)
            assert writer.poll() is None
        done = _cli(["analyze", str(cri), "--json"])
    finally:
        writer.kill()
        writer.wait()
    assert done.returncode == 1, done.stderr
    assert '"max_total_num_tokens": 159277' in done.stdout
