"""Memory stays flat whatever a log holds: each case is read in a fresh interpreter at two sizes, and the
larger may not take more than a little over the smaller (before, every event of an endless startup
was kept: 122 MB at 25 MB, 389 MB at 100 MB of repeated vLLM V0 records).

Peak RSS (ru_maxrss) of a child that only imports the reader and reads the log; generous bounds, no
timing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import ROOT

MIB = 1 << 20

_READ = textwrap.dedent("""
    import resource, sys
    from collectors.logfile import read_log
    x = read_log(sys.argv[1])
    print(len(x.startup.events), x.startup.dropped, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
""")


def _read(path: Path):  # type: ignore[no-untyped-def]
    out = subprocess.run([sys.executable, "-c", _READ, str(path)], capture_output=True, text=True, cwd=str(ROOT),
                         check=True).stdout.split()
    return int(out[0]), int(out[1]), int(out[2])


def _repeat(unit: bytes, size: int, path: Path) -> Path:
    if not unit.endswith(b"\n"):
        unit += b"\n"
    path.write_bytes(unit * (size // len(unit)))
    return path


def _v0_records(size: int, path: Path) -> Path:
    """The issue's case: vLLM V0's profiling, blocks, concurrency and graph lines, again and again, with
    no launch line between them."""
    return _repeat((ROOT / "examples" / "vllm-v0-complete.log").read_bytes(), size, path)


def _one_endless_startup(size: int, path: Path) -> Path:
    """Lines no boundary splits (each a little different, so none is a repeat): one startup of them all."""
    with open(path, "w", encoding="ascii") as f:
        i = written = 0
        while written < size:
            line = "INFO 02-11 10:17:59 [model_runner.py:1671] Graph capturing finished in {} secs, took 0.13 " \
                   "GiB\n".format(i)
            f.write(line)
            written += len(line)
            i += 1
    return path


@pytest.mark.parametrize("make", [_v0_records, _one_endless_startup], ids=["v0-records", "one-startup"])
def test_memory_is_flat_for_any_vllm_input(tmp_path, make: Callable[[int, Path], Path]):
    small = _read(make(4 * MIB, tmp_path / "small.log"))
    large = _read(make(16 * MIB, tmp_path / "large.log"))
    # 12 MiB more log may cost a block or two of reading, not its events (it was ~4× the input before).
    assert large[2] - small[2] < 16 * MIB, (small, large)
    assert large[2] < 128 * MIB


def test_repeated_v0_records_are_one_startup_each(tmp_path):
    # Once a startup ended (init done), the same profiling line again is the next launch, not a repeat.
    events, dropped, _ = _read(_v0_records(1 * MIB, tmp_path / "v0.log"))
    assert (events, dropped) == (8, 0)


def test_an_endless_startup_keeps_its_first_events_and_says_how_many_it_dropped(tmp_path):
    from collectors.events import MAX_STARTUP_EVENTS
    from collectors.logfile import read_log

    path = _one_endless_startup(4 * MIB, tmp_path / "one.log")
    x = read_log(str(path))
    assert len(x.startup.events) == MAX_STARTUP_EVENTS and x.startup.dropped > 0
    assert any("were not kept" in n for n in x.notes)
