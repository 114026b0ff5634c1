"""Memory stays flat whatever a log holds: each case is read in a fresh interpreter at two sizes, and the
larger may not take more than a little over the smaller (before, every event of an endless startup
was kept: 122 MB at 25 MB, 389 MB at 100 MB of repeated vLLM V0 records).

Peak RSS (VmHWM) of a child that only imports the reader and reads the log; generous bounds, no
timing. Linux only (/proc), as the rest of the suite."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import ROOT

MIB = 1 << 20

# The child's own peak: VmHWM is its address space's high-water mark since exec. ru_maxrss would also
# count the pages of the process it was forked from (a test runner grown large by then).
PEAK = textwrap.dedent("""
    def peak():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
""")
_READ = PEAK + textwrap.dedent("""
    import sys
    from kvforensics.collectors.logfile import read_log
    x = read_log(sys.argv[1])
    print(len(x.startup.events), x.startup.dropped, peak())
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
    from kvforensics.collectors.events import MAX_STARTUP_EVENTS
    from kvforensics.collectors.logfile import read_log

    path = _one_endless_startup(4 * MIB, tmp_path / "one.log")
    x = read_log(str(path))
    assert len(x.startup.events) == MAX_STARTUP_EVENTS and x.startup.dropped > 0
    assert any("were not kept" in n for n in x.notes)


# --- one physical line of glued SGLang records ---------------------------------------------------

# The reader's sizes shrunk, so a few MiB exercise what a GiB-sized file meets: reading windows, blocks
# of one endless line, and lines long enough to be cut at their records.
_SHRINK = "from kvforensics.collectors import logfile\n" \
    "logfile.WHOLE_FILE_BYTES, logfile.FIRST_WINDOW_BYTES, logfile.BLOCK_BYTES, logfile.LONG_LINE_BYTES = " \
    "1 << 20, 256 << 10, 64 << 10, 16 << 10\n"


def _read_glued(path: Path, stdin: bool = False):  # type: ignore[no-untyped-def]
    script = _SHRINK + _READ.replace("read_log(sys.argv[1])", "read_log('-' if sys.argv[1] == '-' else sys.argv[1])")
    with open(path, "rb") as f:
        out = subprocess.run([sys.executable, "-c", script, "-" if stdin else str(path)], stdin=f,
                             capture_output=True, text=True, cwd=str(ROOT), check=True).stdout.split()
    return int(out[0]), int(out[1]), int(out[2])


def _glued(size: int, path: Path) -> Path:
    """The seed startup with every newline gone: one line of glued records (a progress bar that never
    printed a newline, or a pipeline that lost them), repeated."""
    unit = (ROOT / "examples" / "kimi-k2.5-tp8-eagle3.log").read_bytes().replace(b"\n", b"")
    path.write_bytes(unit * max(1, size // len(unit)))
    return path


@pytest.mark.parametrize("stdin", [False, True], ids=["file", "stdin"])
def test_memory_is_flat_for_one_line_of_glued_records_of_any_length(tmp_path, stdin):
    small = _read_glued(_glued(4 * MIB, tmp_path / "small.log"), stdin)
    large = _read_glued(_glued(16 * MIB, tmp_path / "large.log"), stdin)
    assert small[0] == large[0] == 148 and small[1] == large[1] == 0  # the last startup, whole
    assert large[2] - small[2] < 16 * MIB, (small, large)  # it was ~16× the file


def test_a_cut_line_gives_the_events_of_its_records(tmp_path):
    """Cut at its records, a glued line gives the seed's own events: the same kinds, ranks and figures,
    each at its own byte offset (a saved startup keeps every piece)."""
    from kvforensics.collectors import logfile
    from kvforensics.collectors.logfile import read_log

    seed = read_log(str(ROOT / "examples" / "kimi-k2.5-tp8-eagle3.log")).startup
    path = _glued(1, tmp_path / "one.log")  # one copy: a 15 KB line
    old = logfile.LONG_LINE_BYTES
    logfile.LONG_LINE_BYTES = 4 << 10
    try:
        glued = read_log(str(path)).startup
    finally:
        logfile.LONG_LINE_BYTES = old
    # tqdm's bare 'Capturing batches (…)' has no record prefix to be cut at: glued, it is inside another record
    own = [(e.kind, e.rank, e.data) for e in seed.events if e.kind != "graph_progress"]
    assert [(e.kind, e.rank, e.data) for e in glued.events] == own
    assert len({e.offset for e in glued.events}) > 100 and all(e.line == 1 for e in glued.events)
