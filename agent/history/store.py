"""Sample history in SQLite: low-water marks of free GPU memory per engine run.

Whether it is safe to give an engine more memory depends on the lowest free memory under real
load, not on one look. ``kvforensics record`` appends samples here (WAL mode, one transaction
per sample, so a killed run leaves the database consistent); recommendations and
``kvforensics history`` read them. Each sample belongs to an engine *run* (one server process
lifetime), so a restart with new flags starts fresh low-water marks.

A file that is not a kvforensics history (corrupt, or another program's database) is never
overwritten: it is renamed aside and a new database is created, and the caller is told.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

APP_ID = 0x4B564653  # "KVFS" in PRAGMA application_id: tells our files from others
SCHEMA_VERSION = 2


def default_path() -> str:
    env = os.environ.get("KVFORENSICS_DB")
    if env:
        return env
    if os.geteuid() == 0:
        return "/var/lib/kvforensics/history.db"
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(state, "kvforensics", "history.db")


# Each entry upgrades the schema from version i to i + 1. Never edit a shipped step: add one.
MIGRATIONS: Sequence[str] = (
    # 0 -> 1
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY, run_key TEXT NOT NULL UNIQUE, host TEXT, engine TEXT,
        started_at REAL, first_seen REAL NOT NULL, last_seen REAL NOT NULL, version_hint TEXT,
        model TEXT, mem_fraction_static REAL, pre_load_free_bytes INTEGER, bytes_per_token INTEGER);
    CREATE TABLE samples (
        id INTEGER PRIMARY KEY, run_id INTEGER REFERENCES runs(id) ON DELETE CASCADE,
        taken_at REAL NOT NULL, collected INTEGER NOT NULL);
    CREATE INDEX samples_taken_at ON samples(taken_at);
    CREATE INDEX samples_run ON samples(run_id);
    CREATE TABLE gpu_samples (
        sample_id INTEGER NOT NULL REFERENCES samples(id) ON DELETE CASCADE, gpu INTEGER NOT NULL, uuid TEXT,
        rank TEXT, total_bytes INTEGER, reserved_bytes INTEGER, used_bytes INTEGER, free_bytes INTEGER,
        engine_used_bytes INTEGER, PRIMARY KEY (sample_id, gpu));
    """,
    # 1 -> 2: live engine load, when the engine exports /metrics
    """
    CREATE TABLE engine_samples (
        sample_id INTEGER PRIMARY KEY REFERENCES samples(id) ON DELETE CASCADE, kv_tokens INTEGER,
        used_tokens INTEGER, token_usage REAL, running INTEGER, queued INTEGER);
    """,
)
assert len(MIGRATIONS) == SCHEMA_VERSION


class HistoryError(Exception):
    """The database cannot be used (read-only place, locked); one actionable sentence."""


class Busy(HistoryError):
    """Another record holds the lock."""


@dataclass
class Opened:
    conn: sqlite3.Connection
    path: str
    moved_aside: Optional[str]  # where an unusable file was renamed, if it was


def _is_ours(conn: sqlite3.Connection) -> Tuple[bool, str]:
    app = conn.execute("PRAGMA application_id").fetchone()[0]
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if app == APP_ID:
        return True, ""
    if app == 0 and not tables:
        return True, ""  # a new, empty file
    return False, "not a kvforensics history (application_id {:#x}, tables: {})".format(
        app, ", ".join(sorted(tables)) or "none")


def _move_aside(path: str) -> str:
    aside = "{}.unusable-{}".format(path, time.strftime("%Y%m%dT%H%M%S"))
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.replace(path + suffix, aside + suffix)
    return aside


def open_db(path: str, create: bool = True) -> Opened:
    """Open (and migrate) the history; an unusable file is moved aside, never overwritten."""
    folder = os.path.dirname(os.path.abspath(path))
    if create:
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise HistoryError("cannot create {}: {} (use --db PATH or KVFORENSICS_DB)".format(folder,
                                                                                               exc.strerror)) from None
    elif not os.path.exists(path):
        raise HistoryError("{}: no history yet (kvforensics record creates it)".format(path))
    if create and not os.access(folder, os.W_OK):
        raise HistoryError("{} is not writable (use --db PATH or KVFORENSICS_DB)".format(folder))
    moved = None
    for attempt in (1, 2):
        try:
            conn = sqlite3.connect(path, timeout=10, isolation_level=None)
            # A text column with invalid UTF-8 (a corrupt page that passes quick_check) must not make
            # every later read fail: decode with replacement.
            conn.text_factory = lambda raw: raw.decode("utf-8", "replace")
            ok, why = _is_ours(conn)
            if ok:
                quick = conn.execute("PRAGMA quick_check").fetchone()[0]
                if quick != "ok":
                    ok, why = False, "integrity check failed: {}".format(quick)
        except sqlite3.DatabaseError as exc:
            ok, why, conn = False, "unreadable as SQLite ({})".format(exc), None
        if ok:
            break
        if conn is not None:
            conn.close()
        if not create or attempt == 2:
            raise HistoryError("{}: {}".format(path, why))
        moved = _move_aside(path)
        moved = "{} ({})".format(moved, why)
    assert conn is not None
    conn.execute("PRAGMA foreign_keys = ON")
    if create:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        _migrate(conn)
    return Opened(conn, path, moved)


def _migrate(conn: sqlite3.Connection) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise HistoryError("the history was written by a newer kvforensics (schema {} > {})".format(version,
                                                                                                    SCHEMA_VERSION))
    for step in range(version, SCHEMA_VERSION):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in MIGRATIONS[step].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("PRAGMA application_id = {}".format(APP_ID))
            conn.execute("PRAGMA user_version = {}".format(step + 1))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise


class Lock:
    """An exclusive, non-blocking lock beside the database: overlapping records exit at once."""

    def __init__(self, db_path: str) -> None:
        self.path = db_path + ".lock"
        self.fd: Optional[int] = None

    def __enter__(self) -> "Lock":
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(folder, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise HistoryError("cannot create {}: {} (use --db PATH or KVFORENSICS_DB)".format(
                exc.filename or folder, exc.strerror)) from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip()
            os.close(self.fd)
            self.fd = None
            raise Busy("another kvforensics record is running{}; this one exits".format(
                " (PID {})".format(holder) if holder else "")) from None
        try:  # the PID only names the holder in the next run's Busy message
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        except OSError:
            pass  # a full disk: the lock holds without it, and the history write says what is wrong
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)


# --- writing -------------------------------------------------------------------------------

def upsert_run(conn: sqlite3.Connection, run_key: str, now: float, **fields: Any) -> int:
    row = conn.execute("SELECT id FROM runs WHERE run_key = ?", (run_key,)).fetchone()
    if row:
        conn.execute("UPDATE runs SET last_seen = ? WHERE id = ?", (now, row[0]))
        return int(row[0])
    cols = ["run_key", "first_seen", "last_seen"] + list(fields)
    values = [run_key, now, now] + list(fields.values())
    cur = conn.execute("INSERT INTO runs ({}) VALUES ({})".format(", ".join(cols), ", ".join("?" * len(cols))), values)
    return int(cur.lastrowid)


def add_sample(conn: sqlite3.Connection, run_id: int, taken_at: float, collected: bool,
               gpus: Sequence[Dict[str, Any]], engine: Optional[Dict[str, Any]]) -> int:
    """One sample, atomically: a kill mid-way leaves the previous samples and no half row."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        cur = conn.execute("INSERT INTO samples (run_id, taken_at, collected) VALUES (?, ?, ?)",
                           (run_id, taken_at, int(collected)))
        sid = int(cur.lastrowid)
        for g in gpus:
            conn.execute("INSERT INTO gpu_samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (sid, g["gpu"], g.get("uuid"), g.get("rank"), g.get("total_bytes"), g.get("reserved_bytes"),
                          g.get("used_bytes"), g.get("free_bytes"), g.get("engine_used_bytes")))
        if engine:
            conn.execute("INSERT INTO engine_samples VALUES (?, ?, ?, ?, ?, ?)",
                         (sid, engine.get("kv_tokens"), engine.get("used_tokens"), engine.get("token_usage"),
                          engine.get("running"), engine.get("queued")))
        conn.execute("COMMIT")
        return sid
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def prune(conn: sqlite3.Connection, older_than: float, keep_run: Optional[int] = None) -> int:
    """Delete samples taken before ``older_than`` (and runs left empty). Returns samples removed.

    The clock is not trusted: the cutoff is never later than the newest sample before this run
    minus the same window (a clock jumped 400 days ahead must not erase the history), and the
    current run's samples (``keep_run``) are never removed."""
    window_end = conn.execute("SELECT MAX(taken_at) FROM samples WHERE run_id IS NOT ?", (keep_run,)).fetchone()[0]
    if window_end is not None:
        now = time.time()
        older_than = min(older_than, window_end - max(0.0, now - older_than))
    conn.execute("BEGIN IMMEDIATE")
    try:
        n = conn.execute("DELETE FROM samples WHERE taken_at < ? AND run_id IS NOT ?",
                         (older_than, keep_run)).rowcount
        conn.execute("DELETE FROM runs WHERE id NOT IN (SELECT DISTINCT run_id FROM samples)")
        conn.execute("COMMIT")
        return n
    except BaseException:
        conn.execute("ROLLBACK")
        raise


# --- reading -------------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuLowWater:
    gpu: int
    uuid: Optional[str]
    rank: Optional[str]
    samples: int
    min_free_bytes: Optional[int]
    max_free_bytes: Optional[int]
    last_free_bytes: Optional[int]
    min_free_at: Optional[float]


@dataclass(frozen=True)
class RunStats:
    run_id: int
    run_key: str
    engine: Optional[str]
    model: Optional[str]
    first_seen: float
    last_seen: float
    samples: int
    gpus: Tuple[GpuLowWater, ...]
    peak_used_tokens: Optional[int]
    peak_token_usage: Optional[float]
    kv_tokens: Optional[int]

    @property
    def span_s(self) -> float:
        return max(0.0, self.last_seen - self.first_seen)


def run_stats(conn: sqlite3.Connection, run_id: int, since: Optional[float] = None) -> RunStats:
    run = conn.execute("SELECT id, run_key, engine, model, first_seen, last_seen FROM runs WHERE id = ?",
                       (run_id,)).fetchone()
    where, args = "s.run_id = ?", [run_id]
    if since is not None:
        where += " AND s.taken_at >= ?"
        args.append(since)
    samples = conn.execute("SELECT COUNT(*) FROM samples s WHERE {} AND s.collected = 1".format(where),
                           args).fetchone()[0]
    gpus = []
    for row in conn.execute(
            "SELECT g.gpu, MAX(g.uuid), MAX(g.rank), COUNT(g.free_bytes), MIN(g.free_bytes), MAX(g.free_bytes) "
            "FROM gpu_samples g JOIN samples s ON s.id = g.sample_id WHERE {} GROUP BY g.gpu ORDER BY "
            "g.gpu".format(where),
            args):
        gpu = row[0]
        at = conn.execute("SELECT s.taken_at FROM gpu_samples g JOIN samples s ON s.id = g.sample_id WHERE {} AND "
                          "g.gpu = ? "
                          "AND g.free_bytes = ? ORDER BY s.id LIMIT 1".format(where), args + [gpu, row[4]]).fetchone()
        last = conn.execute("SELECT g.free_bytes FROM gpu_samples g JOIN samples s ON s.id = g.sample_id WHERE {} AND "
                            "g.gpu = ? ORDER BY s.id DESC LIMIT 1".format(where), args + [gpu]).fetchone()
        gpus.append(GpuLowWater(gpu, row[1], row[2], row[3], row[4], row[5], last[0] if last else None,
                                at[0] if at else None))
    eng = conn.execute("SELECT MAX(e.used_tokens), MAX(e.token_usage), MAX(e.kv_tokens) FROM engine_samples e "
                       "JOIN samples s ON s.id = e.sample_id WHERE {}".format(where), args).fetchone()
    return RunStats(run[0], run[1], run[2], run[3], run[4], run[5], samples, tuple(gpus),
                    eng[0], eng[1], eng[2])


def runs(conn: sqlite3.Connection, since: Optional[float] = None) -> List[int]:
    if since is None:
        return [r[0] for r in conn.execute("SELECT id FROM runs ORDER BY first_seen")]
    return [r[0] for r in conn.execute(
        "SELECT DISTINCT r.id FROM runs r JOIN samples s ON s.run_id = r.id WHERE s.taken_at >= ? ORDER BY "
        "r.first_seen",
        (since,))]


def run_id_for(conn: sqlite3.Connection, run_key: str) -> Optional[int]:
    row = conn.execute("SELECT id FROM runs WHERE run_key = ?", (run_key,)).fetchone()
    return int(row[0]) if row else None


def series(conn: sqlite3.Connection, gpu: int, since: Optional[float] = None) -> Iterator[Tuple[float, Optional[int]]]:
    """(taken_at, free bytes) of one GPU, in sample order (ids, not clock: clocks jump)."""
    where, args = "g.gpu = ?", [gpu]
    if since is not None:
        where += " AND s.taken_at >= ?"
        args.append(since)
    for row in conn.execute("SELECT s.taken_at, g.free_bytes FROM gpu_samples g JOIN samples s ON s.id = g.sample_id "
                            "WHERE {} ORDER BY s.id".format(where), args):
        yield row[0], row[1]


def parse_duration(text: str) -> float:
    """'30d', '12h', '90m', '45s', '2w' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    text = text.strip().lower()
    if len(text) < 2 or text[-1] not in units:
        raise ValueError("durations look like 30d, 12h, 90m, 45s or 2w, not {!r}".format(text))
    try:
        value = float(text[:-1])
    except ValueError:
        raise ValueError("durations look like 30d, 12h, 90m, 45s or 2w, not {!r}".format(text)) from None
    if not 0 < value * units[text[-1]] <= 100 * 365 * 86400:  # also NaN and infinity
        raise ValueError("a duration must be positive and at most 100 years: {!r}".format(text))
    return value * units[text[-1]]
