"""``kvforensics serve``: sample the node when scraped, at most once per ``min_interval``.

Each look is one ``record`` sample: the same history database, the same lock beside it, the
same run keys and low-water marks, so ``serve`` and a cron ``record`` may share a history. The
lock is taken per look, never for the server's lifetime: when a ``record`` holds it, the look is
skipped and the last one is served again (the ``record`` writes the sample that the look would
have written); a ``record`` that starts while ``serve`` is writing exits at once, as it does for
another ``record``.

Between looks the cached payload (the CLI's Prometheus registry) is served as it is. Scrapes
that arrive while a look is being taken wait for it and share it, whatever the interval, so N
concurrent scrapes cost one sample. The payload is opaque here: this floor never imports the
renderers (tests/test_layering.py), the CLI hands in a function that builds it.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from kvforensics.agent.history import record as record_mod
from kvforensics.agent.history import store as history
from kvforensics.agent.model.records import Options

HEALTH_INTERVALS = 3  # /healthz: the last good look is at most this many --min-interval old ...
HEALTH_FLOOR_S = 30.0  # ... or this many seconds, whichever is longer (--min-interval 0 samples every scrape)
LATE_S = 15.0  # a look in progress this long is late: /healthz says so (a stuck collector)


class Skip(Exception):
    """No look this time (another kvforensics holds the history's lock): serve the last one."""


@dataclass(frozen=True)
class Look:
    """One look at the node for ``serve``: what /metrics shows, and whether anything was collected."""

    payload: Any  # what /metrics serves until the next look
    collected: bool  # False: nothing was collected (the payload says so); it does not count as healthy


@dataclass(frozen=True)
class Health:
    """The /healthz answer: whether the last good look is recent enough, and the one line that says why."""

    healthy: bool
    message: str


def health_window(min_interval_s: float) -> float:
    return max(HEALTH_INTERVALS * min_interval_s, HEALTH_FLOOR_S)


class Sampler:
    """Thread-safe cache of the last look. ``take`` makes one look (or raises Skip, or fails)."""

    def __init__(self, take: Callable[[], Look], min_interval_s: float,
                 log: Callable[[str], None] = lambda line: sys.stderr.write(line + "\n"),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._take = take
        self._min_interval_s = min_interval_s
        self._log = log
        self._clock = clock
        self._cond = threading.Condition()
        self._payload: Any = None
        self._looked_at: Optional[float] = None  # the last attempt, skipped or not: paces the next
        self._ok_at: Optional[float] = None  # the last look that collected something
        self._trouble: Optional[str] = None  # why the last attempt did not succeed, if it did not
        self._closed = False  # shutting down: no new look (none may start after the last history write)
        self._busy_since: Optional[float] = None  # when the look in progress began
        self.looks = 0  # looks taken (each a sample in the history)
        self.generation = 0  # attempts finished: a scrape that waited for one shares it

    def current(self, wait_s: Optional[float] = None) -> Any:
        """The payload to serve (None before any look succeeded), looking again when the last look is older
        than the minimum interval. The look runs in a thread of its own; a scrape waits for the look in
        progress (its own or another's, and shares it) at most ``wait_s`` (None: as long as it takes), then
        is answered from the last payload, and ``health`` says the look is late: a collector that never
        returns blocks no scrape and no probe."""
        with self._cond:
            seen = self.generation
            if self._busy_since is None and self._due() and not self._closed:
                self._looked_at = self._busy_since = self._clock()
                threading.Thread(target=self._attempt, name="kvforensics-look", daemon=True).start()
            if self._busy_since is not None:
                self._cond.wait_for(lambda: self.generation != seen, timeout=wait_s)
            return self._payload

    def close(self, wait_s: float = 10.0) -> None:
        """Take no more looks, and wait for one in progress (its history write finishes) at most ``wait_s``: a
        look stuck in a collector must not keep SIGTERM from stopping the server."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._busy_since is None, timeout=wait_s)

    def _due(self) -> bool:
        return self._looked_at is None or self._clock() - self._looked_at >= self._min_interval_s

    def _attempt(self) -> None:
        """One look, outside the lock; what it found is published under it."""
        trouble: Optional[str] = None
        look: Optional[Look] = None
        try:
            look = self._take()
        except Skip as exc:
            trouble = "skipped a sample{}: {}".format(", serving the last one" if self._payload is not None else "",
                                                      exc)
        except Exception as exc:  # noqa: BLE001 - a failed look must not take the server down
            trouble = "sample failed: {}".format(str(exc) or type(exc).__name__)
        with self._cond:
            if look is not None:
                self.looks += 1
                self._payload = look.payload
                if look.collected:
                    self._ok_at = self._clock()
                else:
                    trouble = "sample collected nothing on this node (no GPU, no engine, no host memory)"
            self._note(trouble)
            self._busy_since = None
            self.generation += 1
            self._cond.notify_all()

    def _note(self, trouble: Optional[str]) -> None:
        """One line on stderr when the state changes, not one per scrape."""
        if trouble != self._trouble:
            self._log("kvforensics serve: {}".format(trouble or "sampling again"))
        self._trouble = trouble

    def health(self, window_s: float) -> Health:
        busy = self._busy_since
        if busy is not None and self._clock() - busy > LATE_S:
            return Health(False, "the sample is late: a look began {:.0f} s ago and has not finished (a collector "
                          "is stuck: NVML, /proc or the engine's log)".format(self._clock() - busy))
        if self._ok_at is None:
            return Health(False, "no successful sample yet{}".format(
                " ({})".format(self._trouble) if self._trouble else ""))
        age = self._clock() - self._ok_at
        if age > window_s:
            return Health(False, "last successful sample {:.0f} s ago, more than {:.0f} s{}".format(
                age, window_s, " ({})".format(self._trouble) if self._trouble else ""))
        return Health(True, "last successful sample {:.1f} s ago{}".format(
            age, " (last attempt: {})".format(self._trouble) if self._trouble else ""))


def record_one(db_path: str, collect: Callable[[], List[Dict[str, Any]]], opts: Options, keep_s: Optional[float],
               target: str, engine: Optional[str] = None,
               gone_after_s: float = record_mod.GONE_WINDOW_S) -> record_mod.RecordResult:
    """One ``record`` sample under the history's lock; the lock held elsewhere is a Skip, never a wait:
    a ``record --samples 6 --interval 20`` holds it for 100 s, longer than any scrape timeout."""
    try:
        with history.Lock(db_path):
            return record_mod.record(db_path, collect, opts, 1, 0.0, keep_s, target, engine, gone_after_s)
    except history.Busy:
        raise Skip("the history {} is locked by another kvforensics{}".format(db_path, _holder(db_path))) from None


def _holder(db_path: str) -> str:
    try:
        with open(db_path + ".lock") as f:
            pid = f.read(32).strip()
    except OSError:
        return ""
    return " (PID {})".format(pid) if pid.isdigit() else ""
