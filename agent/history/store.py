"""Sample history in SQLite: low-water marks of free GPU memory per engine run.

Whether it is safe to give an engine more memory depends on the lowest free memory under real
load, not on one look. ``kvforensics record`` appends samples here (WAL mode, one transaction
per sample, so a killed run leaves the database consistent); recommendations and
``kvforensics history`` read them. Each sample belongs to an engine *run* (one server process
lifetime), so a restart with new flags starts fresh low-water marks.

Only our own file is ever written, migrated or moved aside: a regular file that is a kvforensics
history (our ``PRAGMA application_id``, or an older history without it, known by its exact tables),
or an empty one. Anything else at the path (a directory, a FIFO, a device, another program's
database: ``record`` runs as root from cron, and a typo in ``--db`` must not move a system
directory) is refused before anything is opened for writing (``Refused``). Our own history when
damaged (``Corrupt``: unreadable, wrong tables, a value no kvforensics writes) is renamed aside
by ``record`` and a new one created; ``history`` says so and stops. Every value read is checked
where it is read (``Kind``), so a hostile file cannot reach a report as an untyped value.
"""

from __future__ import annotations

import fcntl
import functools
import itertools
import os
import re
import sqlite3
import stat
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple, TypeVar
from urllib.parse import quote

from kvforensics.agent.history.filekind import kind_of

APP_ID = 0x4B564653  # "KVFS" in PRAGMA application_id: tells our files from others
SCHEMA_VERSION = 3
SQLITE_MAGIC = b"SQLite format 3\x00"
HEADER_BYTES = 100  # the SQLite header; the application_id is its bytes 68–71, big-endian
SIBLINGS = ("-wal", "-shm", "-journal")  # SQLite's own files beside the database: moved with it

# What claim() finds at a path; anything else is refused.
MISSING, EMPTY, OURS, UNSTAMPED = "missing", "empty", "ours", "unstamped"


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
    # 2 -> 3: one history for every engine on the node: each run's port and pod (an engine that is gone is
    # still named by its labels), each GPU's PCI bus id and model (a lost GPU keeps them), and the startup
    # each run's log held (reused when the log no longer holds it: rotated, truncated)
    """
    ALTER TABLE runs ADD COLUMN port INTEGER;
    ALTER TABLE runs ADD COLUMN namespace TEXT;
    ALTER TABLE runs ADD COLUMN pod TEXT;
    ALTER TABLE runs ADD COLUMN container TEXT;
    ALTER TABLE gpu_samples ADD COLUMN pci_bus_id TEXT;
    ALTER TABLE gpu_samples ADD COLUMN name TEXT;
    CREATE TABLE startups (
        run_id INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE, read_at REAL NOT NULL,
        section TEXT NOT NULL);
    """,
)
assert len(MIGRATIONS) == SCHEMA_VERSION


class HistoryError(Exception):
    """The database cannot be used (read-only place, locked); one actionable sentence."""


class Busy(HistoryError):
    """Another record holds the lock."""


class Refused(HistoryError):
    """Not a kvforensics history (a directory, a FIFO, another program's file): left exactly as it is."""


class Corrupt(HistoryError):
    """Our own history, but damaged, or holding a value no kvforensics writes."""

    def __init__(self, why: str, path: str = "") -> None:
        self.why = " ".join(why.split())[:300]  # one line, whatever an SQLite message or a cell held
        self.path = path
        super().__init__("{}the history is corrupt ({}); move it aside or delete it, and kvforensics record starts "
                         "a new one".format(path + ": " if path else "", self.why))

    def at(self, path: str) -> "Corrupt":
        return Corrupt(self.why, path)


@dataclass(frozen=True)
class Opened:
    """An open history: its connection, its path, and where an unusable file was moved aside (None: it was not)."""

    conn: sqlite3.Connection
    path: str
    moved_aside: Optional[str]  # where our unusable file was renamed (and why), if it was


# --- what a cell may hold ------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class Kind:
    """The values a column may hold. The writer stores only such values (others become NULL: a driver's
    nonsense figure is unknown, not history) and every reader checks them, so a value that fails
    here was not written by kvforensics: the file is corrupt."""
    what: str
    lo: float = 0
    hi: float = 0
    real: bool = False  # floats allowed besides integers
    text: bool = False  # text of at most ``hi`` characters, no control characters
    required: bool = False

    def fits(self, value: Any) -> bool:
        if value is None:
            return not self.required
        if self.text:
            return isinstance(value, str) and len(value) <= self.hi and not _CONTROL.search(value)
        if isinstance(value, float):
            return self.real and self.lo <= value <= self.hi  # NaN and ±inf fail
        return isinstance(value, int) and self.lo <= value <= self.hi


YEAR_2200 = 7258118400
TIME = Kind("a time within 1970–2200", 0, YEAR_2200, real=True)
BYTES = Kind("a byte count within 0–1 PiB", 0, 1 << 50)
COUNT = Kind("a count within 0–2^40", 0, 1 << 40)
SHARE = Kind("a share within 0–1", 0, 1, real=True)
GPU = Kind("a GPU index within 0–65535", 0, 65535, required=True)
PORT = Kind("a port within 0–65535", 0, 65535)
TEXT = Kind("text of at most 4096 characters without control characters", hi=4096, text=True)
# A startup's log section as JSON (ASCII: every control character escaped), at most 64 MiB.
SECTION = Kind("a JSON startup section of at most 64 MiB", hi=64 << 20, text=True, required=True)


TIME_REQUIRED = Kind(TIME.what, TIME.lo, TIME.hi, real=True, required=True)
TEXT_REQUIRED = Kind(TEXT.what, hi=TEXT.hi, text=True, required=True)


RUN_FIELDS = {"host": TEXT, "engine": TEXT, "started_at": TIME, "version_hint": TEXT, "model": TEXT,
              "mem_fraction_static": SHARE, "pre_load_free_bytes": BYTES, "bytes_per_token": COUNT, "port": PORT,
              "namespace": TEXT, "pod": TEXT, "container": TEXT}
GPU_FIELDS = {"uuid": TEXT, "rank": TEXT, "total_bytes": BYTES, "reserved_bytes": BYTES, "used_bytes": BYTES,
              "free_bytes": BYTES, "engine_used_bytes": BYTES, "pci_bus_id": TEXT, "name": TEXT}
ENGINE_FIELDS = {"kv_tokens": COUNT, "used_tokens": COUNT, "token_usage": SHARE, "running": COUNT, "queued": COUNT}


def _typed(kind: Kind, value: Any, where: str) -> Any:
    """``value`` as read from ``where`` (table.column), or Corrupt."""
    if not kind.fits(value):
        shown = repr(value)
        raise Corrupt("{} holds {}, not {}".format(where, shown if len(shown) <= 40 else shown[:37] + "...",
                                                   kind.what))
    return value


def _kept(kind: Kind, value: Any) -> Any:
    """What the writer stores: the value when it fits, else NULL (unknown)."""
    return value if kind.fits(value) else None


def _text(raw: bytes) -> str:
    # A text column with invalid UTF-8 (a corrupt page that passes quick_check) must not make every
    # later read fail: decode with replacement.
    return raw.decode("utf-8", "replace")


T = TypeVar("T")


def _reading(fn: Callable[..., T]) -> Callable[..., T]:
    """SQLite's corruption errors (and its messages that are not UTF-8) raised while reading or writing
    our file are Corrupt; OperationalError (locked, full disk, read-only) stays what it is."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except sqlite3.OperationalError:
            raise
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            raise Corrupt("unreadable: {}".format(exc)) from None
    return wrapper


# --- whose file is it ----------------------------------------------------------------------



def _left(path: str, what: str) -> Refused:
    return Refused("{} {}, not a kvforensics history; it was left as it is (--db PATH or KVFORENSICS_DB names the "
                   "history file)".format(path, what))


def claim(path: str) -> str:
    """What ``path`` holds, as far as taking it goes: MISSING, EMPTY (no bytes, or an SQLite file with nothing
    in it: what a record killed while creating it leaves), OURS (our application_id; perhaps damaged), or
    UNSTAMPED (an older history without it, known by its exact tables). Anything else is Refused. Nothing
    but a regular file is ever opened (a FIFO would block, a device may act on open), and nothing is
    written."""
    try:
        link = os.lstat(path)
    except FileNotFoundError:
        return MISSING
    except OSError as exc:
        raise HistoryError("{}: {}".format(path, exc.strerror)) from None
    try:
        st = os.stat(path)
    except OSError:
        raise _left(path, "is a symlink to nothing") from None
    if not stat.S_ISREG(st.st_mode):
        raise _left(path, "is {}{}".format("a symlink to " if stat.S_ISLNK(link.st_mode) else "",
                                           kind_of(st.st_mode)))
    for suffix in SIBLINGS:
        _check_sibling(path + suffix)
    head = _head(path, st)
    if not head:
        return EMPTY
    if len(head) < HEADER_BYTES or not head.startswith(SQLITE_MAGIC):
        raise _left(path, "is not an SQLite database")
    app = int.from_bytes(head[68:72], "big")
    if app == APP_ID:
        return OURS
    if app != 0:
        raise _left(path, "is another program's SQLite database (application_id {:#x})".format(app))
    return _unstamped(path)


def _check_sibling(path: str) -> None:
    """SQLite writes its -wal, -shm and -journal files and we move them aside with the database: they
    must be plain files too (a symlink there would have SQLite write through it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise HistoryError("{}: {}".format(path, exc.strerror)) from None
    if not stat.S_ISREG(st.st_mode):
        raise _left(path, "is {}".format("a symlink" if stat.S_ISLNK(st.st_mode) else kind_of(st.st_mode)))


def _head(path: str, st: os.stat_result) -> bytes:
    """The first bytes of the regular file ``st`` describes (re-checked on the open descriptor)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise HistoryError("{}: cannot read it: {}".format(path, exc.strerror)) from None
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise _left(path, "changed while it was checked")
        return os.pread(fd, HEADER_BYTES, 0)
    finally:
        os.close(fd)


def _unstamped(path: str) -> str:
    """An SQLite file without an application_id: ours only if empty or with exactly our tables. Read
    without writing: immutable (no -wal or -shm created) unless a -wal holds part of it."""
    mode = "mode=ro" if os.path.exists(path + "-wal") else "immutable=1"
    try:
        conn = sqlite3.connect("file:{}?{}".format(quote(os.path.abspath(path)), mode), uri=True)
        try:
            conn.text_factory = _text
            app, version, objects = _header(conn)
            layout = _layout(conn)
        finally:
            conn.close()
    except (sqlite3.Error, ValueError) as exc:
        raise _left(path, "is an SQLite database kvforensics cannot read ({})".format(
            " ".join(str(exc).split())[:120])) from None
    if app == APP_ID:
        return OURS  # stamped in the -wal, not yet in the file (a record killed before its checkpoint)
    if app == 0 and objects == 0 and version == 0:
        return EMPTY
    if app == 0 and 1 <= version <= SCHEMA_VERSION and layout == _expected(version):
        return UNSTAMPED
    raise _left(path, "is another program's SQLite database (tables: {})".format(
        ", ".join(sorted(layout))[:120] or "none"))


def _header(conn: sqlite3.Connection) -> Tuple[int, int, int]:
    app = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    objects = conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]
    return app, version, objects


Layout = Dict[str, Tuple[Tuple[Any, ...], ...]]


def _layout(conn: sqlite3.Connection) -> Layout:
    """Tables and their columns (name, type, not null, primary key), as SQLite parsed the schema: a
    column renamed in the schema text shows here even when quick_check passes."""
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND "
                                        "name NOT LIKE 'sqlite!_%' ESCAPE '!'")]
    return {str(n): tuple(tuple(r) for r in conn.execute(
        "SELECT name, upper(type), \"notnull\", pk FROM pragma_table_info(?)", (n,))) for n in names}


@functools.lru_cache(maxsize=None)
def _expected(version: int) -> Layout:
    """Our tables at schema ``version``, by running the migrations in memory."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        for step in MIGRATIONS[:version]:
            conn.executescript(step)
        return _layout(conn)
    finally:
        conn.close()


def _layout_problem(found: Layout, version: int) -> Optional[str]:
    want = _expected(version)
    if found == want:
        return None
    odd = sorted(set(found) ^ set(want)) or sorted(t for t in want if found[t] != want[t])
    return "its tables are not those of schema {} ({} differs)".format(version, ", ".join(odd)[:120])


# --- opening -------------------------------------------------------------------------------

def open_db(path: str, create: bool = True, run_keys: Sequence[str] = (), startup_keys: Sequence[str] = ()) -> Opened:
    """Open (and, for record, create or migrate) our history. Not ours: Refused, untouched. Ours but
    damaged: Corrupt, or with ``create`` moved aside (never overwritten: as it was, before any write)
    and a new one started. ``run_keys``: the engine runs record is about to write (one per engine); what
    it will read of the history is read first: their figures, and the startups kept for ``startup_keys``
    (the runs whose log no longer holds theirs; a startup record will not read is not checked on every run)."""
    kind = claim(path)
    if not create and kind in (MISSING, EMPTY):
        raise HistoryError("{}: no history yet (kvforensics record creates it)".format(path))
    if create:
        _ensure_folder(path)
    try:
        conn = _connect(path, kind, create, tuple(run_keys), frozenset(startup_keys))
    except Corrupt as exc:
        if kind not in (OURS, UNSTAMPED):  # an empty SQLite file that fails is nobody's history we know
            raise _left(path, "is an SQLite file kvforensics cannot use ({})".format(exc.why)) from None
        if not create:
            raise exc.at(path) from None
        return fresh(path, exc.why)
    return Opened(conn, path, None)


def fresh(path: str, why: str) -> Opened:
    """Move our unusable history aside and start a new one; the caller holds the Lock."""
    aside = "{} ({})".format(_move_aside(path), why)
    return Opened(_connect(path, claim(path), True, ()), path, aside)


def _ensure_folder(path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise HistoryError("cannot create {}: {} (use --db PATH or KVFORENSICS_DB)".format(folder,
                                                                                           exc.strerror)) from None
    if not os.access(folder, os.W_OK):
        raise HistoryError("{} is not writable (use --db PATH or KVFORENSICS_DB)".format(folder))


def _connect(path: str, kind: str, create: bool, run_keys: Tuple[str, ...],
             startup_keys: FrozenSet[str] = frozenset()) -> sqlite3.Connection:
    """A connection to our history, checked: the header, quick_check, the exact tables, and for record
    the values it will read. All before the first write, so a file moved aside is the file found."""
    conn = sqlite3.connect(path, timeout=10, isolation_level=None)
    try:
        conn.text_factory = _text
        version = _check(conn, path, kind, create)
        if create:
            _read_before_write(conn, run_keys, startup_keys, version)
        conn.execute("PRAGMA foreign_keys = ON")
        if create:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            _migrate(conn)
        return conn
    except sqlite3.OperationalError as exc:  # a full disk, a read-only file: record says "cannot write"
        conn.close()
        if create:
            raise
        raise HistoryError("{}: cannot read the history: {}".format(path, " ".join(str(exc).split()))) from None
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        conn.close()
        raise Corrupt("unreadable as SQLite: {}".format(exc)) from None
    except BaseException:
        conn.close()
        raise


def _check(conn: sqlite3.Connection, path: str, kind: str, create: bool) -> int:
    app, version, _ = _header(conn)
    if app not in (APP_ID, 0) or (app == 0 and kind == OURS):
        raise _left(path, "changed while it was checked")
    if version > SCHEMA_VERSION:
        raise HistoryError("{}: the history was written by a newer kvforensics (schema {} > {})".format(
            path, version, SCHEMA_VERSION))
    if version < 0:
        raise Corrupt("schema version {}".format(version))
    head = _head(path, os.stat(path))
    if head and head[18:20] not in (b"\x01\x01", b"\x02\x02"):  # SQLite would take it as read-only
        raise Corrupt("its SQLite header is damaged (file format bytes {})".format(head[18:20].hex()))
    quick = conn.execute("PRAGMA quick_check").fetchone()[0]
    if quick != "ok":
        raise Corrupt("integrity check failed: {}".format(quick))
    problem = _layout_problem(_layout(conn), version)
    if problem:
        raise Corrupt(problem)
    if not create and version < SCHEMA_VERSION:
        raise HistoryError("{}: the history has schema {}; kvforensics record upgrades it to {}".format(
            path, version, SCHEMA_VERSION))
    return int(version)


def _move_aside(path: str) -> str:
    """Rename our file (and SQLite's files beside it) to a name no file has yet: never overwrite."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for n in itertools.count():
        aside = "{}.unusable-{}{}".format(path, stamp, "-{}".format(n) if n else "")
        if not any(os.path.lexists(aside + suffix) for suffix in ("",) + SIBLINGS):
            break
    try:
        for suffix in ("",) + SIBLINGS:
            if os.path.lexists(path + suffix):
                os.replace(path + suffix, aside + suffix)
    except OSError as exc:
        raise HistoryError("{}: cannot move the unusable history aside: {}".format(path, exc.strerror)) from None
    return aside


def _migrate(conn: sqlite3.Connection) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
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
    if conn.execute("PRAGMA application_id").fetchone()[0] != APP_ID:
        conn.execute("PRAGMA application_id = {}".format(APP_ID))  # an older history, known by its tables


class Lock:
    """An exclusive, non-blocking lock beside the database: overlapping records exit at once. The lock
    file is truncated and written (the PID), so it must be a plain file of its own: never through a
    symlink, a FIFO or a second name of another file."""

    def __init__(self, db_path: str) -> None:
        self.path = db_path + ".lock"
        self.fd: Optional[int] = None

    def __enter__(self) -> "Lock":
        folder = os.path.dirname(os.path.abspath(self.path))
        _check_sibling(self.path)  # before the open: opening a device may act on it
        try:
            os.makedirs(folder, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                              | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise HistoryError("cannot create {}: {} (use --db PATH or KVFORENSICS_DB)".format(
                exc.filename or folder, exc.strerror)) from None
        st = os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(self.fd)
            self.fd = None
            raise _left(self.path, "is {}".format(kind_of(st.st_mode) if not stat.S_ISREG(st.st_mode)
                                                  else "a second name of another file"))
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip()
            os.close(self.fd)
            self.fd = None
            raise Busy("another kvforensics record is running{}; this one exits".format(
                " (PID {})".format(holder) if holder.isdigit() else "")) from None
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

def _now_checked(now: float) -> float:
    if not TIME.fits(now):
        raise HistoryError("the clock reads {!r}, outside 1970–2200: nothing was recorded".format(now))
    return now


@_reading
def upsert_run(conn: sqlite3.Connection, run_key: str, now: float, **fields: Any) -> int:
    _now_checked(now)
    row = conn.execute("SELECT id FROM runs WHERE run_key = ?", (run_key,)).fetchone()
    if row:
        conn.execute("UPDATE runs SET last_seen = ? WHERE id = ?", (now, row[0]))
        return int(row[0])
    cols = ["run_key", "first_seen", "last_seen"] + list(fields)
    values = [_typed(TEXT_REQUIRED, run_key, "run_key"), now, now] + [_kept(RUN_FIELDS[k], v)
                                                                         for k, v in fields.items()]
    cur = conn.execute("INSERT INTO runs ({}) VALUES ({})".format(", ".join(cols), ", ".join("?" * len(cols))), values)
    return int(cur.lastrowid)


@_reading
def add_sample(conn: sqlite3.Connection, run_id: int, taken_at: float, collected: bool,
               gpus: Sequence[Dict[str, Any]], engine: Optional[Dict[str, Any]]) -> int:
    """One sample, atomically: a kill mid-way leaves the previous samples and no half row."""
    _now_checked(taken_at)
    conn.execute("BEGIN IMMEDIATE")
    try:
        cur = conn.execute("INSERT INTO samples (run_id, taken_at, collected) VALUES (?, ?, ?)",
                           (run_id, taken_at, int(collected)))
        sid = int(cur.lastrowid)
        for g in gpus:
            if not GPU.fits(g["gpu"]):
                continue  # a driver's index no reader would take: the GPU is left out, not the sample
            conn.execute("INSERT INTO gpu_samples (sample_id, gpu, {}) VALUES ({})".format(
                ", ".join(GPU_FIELDS), ", ".join("?" * (2 + len(GPU_FIELDS)))),
                [sid, g["gpu"]] + [_kept(kind, g.get(k)) for k, kind in GPU_FIELDS.items()])
        if engine:
            conn.execute("INSERT INTO engine_samples VALUES (?, ?, ?, ?, ?, ?)",
                         [sid] + [_kept(kind, engine.get(k)) for k, kind in ENGINE_FIELDS.items()])
        conn.execute("COMMIT")
        return sid
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _not_in(runs: Sequence[int]) -> str:
    return "(run_id IS NULL OR run_id NOT IN ({}))".format(", ".join(str(int(r)) for r in runs))


@_reading
def prune(conn: sqlite3.Connection, older_than: float, keep_runs: Sequence[int] = ()) -> int:
    """Delete samples taken before ``older_than`` (and runs left empty). Returns samples removed.

    The clock is not trusted: the cutoff is never later than the newest sample before these runs
    minus the same window (a clock jumped 400 days ahead must not erase the history), and the
    current runs' samples (``keep_runs``, one per engine) are never removed."""
    window_end = _newest(conn, keep_runs)
    if window_end is not None:
        now = time.time()
        older_than = min(older_than, window_end - max(0.0, now - older_than))
    conn.execute("BEGIN IMMEDIATE")
    try:
        n = conn.execute("DELETE FROM samples WHERE taken_at < ? AND {}".format(_not_in(keep_runs)),
                         (older_than,)).rowcount
        conn.execute("DELETE FROM runs WHERE id NOT IN (SELECT DISTINCT run_id FROM samples)")
        conn.execute("COMMIT")
        return n
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _newest(conn: sqlite3.Connection, other_than: Sequence[int]) -> Optional[float]:
    """The newest sample's time outside runs ``other_than`` (MAX sorts text and blobs above numbers, so
    one checked value covers the column)."""
    at = conn.execute("SELECT MAX(taken_at) FROM samples WHERE {}".format(_not_in(other_than))).fetchone()[0]
    return _typed(TIME, at, "samples.taken_at")


@_reading
def _read_before_write(conn: sqlite3.Connection, run_keys: Tuple[str, ...], startup_keys: FrozenSet[str],
                       version: int) -> None:
    """What record will read, read before it writes: the runs (one row per engine run: few) with their
    labels, every sample's time, these engine runs' figures, and the startups it will use (tables of the
    current schema only: an older one is migrated first)."""
    if version == 0:
        return  # nothing in it yet
    for key in run_keys if version == SCHEMA_VERSION else ():
        rid = run_id_for(conn, key)
        if rid is not None:
            run_stats(conn, rid)
            if key in startup_keys:
                startup(conn, rid)
    for row in conn.execute("SELECT {} FROM runs".format(RUN_COLUMNS)):
        _run_row(row)
    if version == SCHEMA_VERSION:
        recent_runs(conn, None)
    # every sample time within bounds (the index answers both): then so is prune's newest of any subset
    low, high = conn.execute("SELECT MIN(taken_at), MAX(taken_at) FROM samples").fetchone()
    _typed(TIME, low, "samples.taken_at")
    _typed(TIME, high, "samples.taken_at")


# --- reading: every value is checked where it is read (Kind) ------------------------------

@dataclass(frozen=True)
class GpuLowWater:
    """One GPU's free memory over an engine run's samples (or those since a time): least, most and last, and when
    it was least; None: no sample held the figure."""

    gpu: int
    uuid: Optional[str]
    rank: Optional[str]
    samples: int
    min_free_bytes: Optional[int]
    max_free_bytes: Optional[int]
    last_free_bytes: Optional[int]
    min_free_at: Optional[float]
    pci_bus_id: Optional[str] = None  # as NVML last named them: a lost GPU's series keep their labels
    name: Optional[str] = None


@dataclass(frozen=True)
class RunStats:
    """An engine run as the history holds it (all its samples, or those since a time): its labels and span, the
    collected samples' count, each GPU's low water, and the engine's peak KV use and pool size."""

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


def _where(run_id: int, since: Optional[float]) -> Tuple[str, List[Any]]:
    where, args = "s.run_id = ?", [run_id]
    if since is not None:
        where += " AND s.taken_at >= ?"
        args.append(since)
    return where, args


@_reading
def run_stats(conn: sqlite3.Connection, run_id: int, since: Optional[float] = None) -> RunStats:
    run = conn.execute("SELECT {} FROM runs WHERE id = ?".format(RUN_COLUMNS), (run_id,)).fetchone()
    if run is None:
        raise Corrupt("run {} has samples but no row in runs".format(run_id))
    run = _run_row(run)
    where, args = _where(run_id, since)
    samples = conn.execute("SELECT COUNT(*) FROM samples s WHERE {} AND s.collected = 1".format(where),
                           args).fetchone()[0]
    gpus = tuple(_low_water(conn, where, args, row) for row in conn.execute(
        "SELECT g.gpu, MAX(g.uuid), MAX(g.rank), COUNT(g.free_bytes), MIN(g.free_bytes), MAX(g.free_bytes), "
        "MAX(g.pci_bus_id), MAX(g.name) "
        "FROM gpu_samples g JOIN samples s ON s.id = g.sample_id WHERE {} GROUP BY g.gpu ORDER BY "
        "g.gpu".format(where), args).fetchall())
    # MAX sorts text and blobs above numbers: one checked value stands for the column
    eng = conn.execute("SELECT MAX(e.used_tokens), MAX(e.token_usage), MAX(e.kv_tokens) FROM engine_samples e "
                       "JOIN samples s ON s.id = e.sample_id WHERE {}".format(where), args).fetchone()
    return RunStats(run_id=run[0], run_key=run[1], engine=run[2], model=run[3], first_seen=run[4],
                    last_seen=run[5], samples=samples, gpus=gpus,
                    peak_used_tokens=_typed(COUNT, eng[0], "engine_samples.used_tokens"),
                    peak_token_usage=_typed(SHARE, eng[1], "engine_samples.token_usage"),
                    kv_tokens=_typed(COUNT, eng[2], "engine_samples.kv_tokens"))


RUN_COLUMNS = "id, run_key, engine, model, first_seen, last_seen"


def _run_row(row: Sequence[Any]) -> Tuple[Any, ...]:
    return (row[0], _typed(TEXT_REQUIRED, row[1], "runs.run_key"), _typed(TEXT, row[2], "runs.engine"),
            _typed(TEXT, row[3], "runs.model"), _typed(TIME_REQUIRED, row[4], "runs.first_seen"),
            _typed(TIME_REQUIRED, row[5], "runs.last_seen"))


def _low_water(conn: sqlite3.Connection, where: str, args: List[Any], row: Sequence[Any]) -> GpuLowWater:
    gpu = _typed(GPU, row[0], "gpu_samples.gpu")
    # MIN and MAX of a column bound all of it: a text, blob, float or negative value shows in one of them
    low, high = _typed(BYTES, row[4], "gpu_samples.free_bytes"), _typed(BYTES, row[5], "gpu_samples.free_bytes")
    at = conn.execute("SELECT s.taken_at FROM gpu_samples g JOIN samples s ON s.id = g.sample_id WHERE {} AND "
                      "g.gpu = ? AND g.free_bytes = ? ORDER BY s.id LIMIT 1".format(where),
                      args + [gpu, low]).fetchone()
    last = conn.execute("SELECT g.free_bytes FROM gpu_samples g JOIN samples s ON s.id = g.sample_id WHERE {} AND "
                        "g.gpu = ? ORDER BY s.id DESC LIMIT 1".format(where), args + [gpu]).fetchone()
    return GpuLowWater(gpu=gpu, uuid=_typed(TEXT, row[1], "gpu_samples.uuid"),
                       rank=_typed(TEXT, row[2], "gpu_samples.rank"), samples=row[3], min_free_bytes=low,
                       max_free_bytes=high,
                       last_free_bytes=_typed(BYTES, last[0] if last else None, "gpu_samples.free_bytes"),
                       min_free_at=_typed(TIME, at[0] if at else None, "samples.taken_at"),
                       pci_bus_id=_typed(TEXT, row[6], "gpu_samples.pci_bus_id"),
                       name=_typed(TEXT, row[7], "gpu_samples.name"))


@_reading
def runs(conn: sqlite3.Connection, since: Optional[float] = None) -> List[int]:
    if since is None:
        return [r[0] for r in conn.execute("SELECT id FROM runs ORDER BY first_seen")]
    return [r[0] for r in conn.execute(
        "SELECT DISTINCT r.id FROM runs r JOIN samples s ON s.run_id = r.id WHERE s.taken_at >= ? ORDER BY "
        "r.first_seen",
        (since,))]


@_reading
def run_id_for(conn: sqlite3.Connection, run_key: str) -> Optional[int]:
    row = conn.execute("SELECT id FROM runs WHERE run_key = ?", (run_key,)).fetchone()
    return int(row[0]) if row else None


@dataclass(frozen=True)
class RecentRun:
    """An engine run as the history names it: enough to say that its engine is gone."""

    run_key: str
    engine: str  # "<engine>-<port>"
    port: Optional[int]
    pod: Tuple[Tuple[str, str], ...]  # (label, value): namespace, pod, container when it ran in a pod
    first_seen: float
    last_seen: float


_RECENT = "run_key, engine, port, namespace, pod, container, first_seen, last_seen"


def _recent_row(row: Sequence[Any]) -> RecentRun:
    pod = tuple((name, _typed(TEXT, value, "runs." + name)) for name, value in zip(("namespace", "pod", "container"),
                                                                                    row[3:6]))
    return RecentRun(run_key=_typed(TEXT_REQUIRED, row[0], "runs.run_key"),
                     engine=_typed(TEXT_REQUIRED, row[1], "runs.engine"), port=_typed(PORT, row[2], "runs.port"),
                     pod=tuple((k, v) for k, v in pod if v is not None),
                     first_seen=_typed(TIME_REQUIRED, row[6], "runs.first_seen"),
                     last_seen=_typed(TIME_REQUIRED, row[7], "runs.last_seen"))


@_reading
def recent_runs(conn: sqlite3.Connection, since: Optional[float]) -> List[RecentRun]:
    """The engine runs last seen at or after ``since`` (all when None), most recently seen last."""
    where, args = ("engine IS NOT NULL", []) if since is None else ("engine IS NOT NULL AND last_seen >= ?",
                                                                    [since])
    return [_recent_row(r) for r in conn.execute("SELECT {} FROM runs WHERE {} ORDER BY last_seen, id".format(
        _RECENT, where), args)]


@_reading
def last_success(conn: sqlite3.Connection) -> Optional[float]:
    """When the last sample that collected something was taken (the last inserted: clocks jump)."""
    row = conn.execute("SELECT taken_at FROM samples WHERE collected = 1 ORDER BY id DESC LIMIT 1").fetchone()
    return _typed(TIME, row[0], "samples.taken_at") if row else None


@dataclass(frozen=True)
class KeptStartup:
    """An engine run's startup section as the history keeps it, for when the engine's log no longer holds it."""

    read_at: float  # when its log last held it
    section: Dict[str, Any]  # the snapshot's engine_log section as read then


@_reading
def startup(conn: sqlite3.Connection, run_id: int) -> Optional[KeptStartup]:
    """The startup section kept for an engine run (the snapshot's ``engine_log`` as its log held it), or
    None. Checked against the snapshot schema: anything else was not written by kvforensics."""
    from kvforensics.agent.model import evidence

    row = conn.execute("SELECT read_at, section FROM startups WHERE run_id = ?", (run_id,)).fetchone()
    if row is None:
        return None
    _typed(TIME_REQUIRED, row[0], "startups.read_at")
    text = _typed(SECTION, row[1], "startups.section")
    try:
        section = evidence.loads(text)
        evidence.check_section("engine_log", section)
    except evidence.EvidenceError as exc:
        raise Corrupt("startups.section is not a startup section ({})".format(exc)) from None
    return KeptStartup(read_at=row[0], section=section)


@_reading
def save_startup(conn: sqlite3.Connection, run_id: int, section: Dict[str, Any], now: float) -> bool:
    """Keep the startup an engine run's log holds now; False when it is kept already (or too large)."""
    import json

    text = json.dumps(section, ensure_ascii=True, sort_keys=True, allow_nan=False)
    if not SECTION.fits(text):
        return False  # a startup over 64 MiB is not kept: its log is read as before
    row = conn.execute("SELECT section FROM startups WHERE run_id = ?", (run_id,)).fetchone()
    if row is not None and row[0] == text:
        return False
    conn.execute("INSERT OR REPLACE INTO startups (run_id, read_at, section) VALUES (?, ?, ?)",
                 (run_id, _now_checked(now), text))
    return True


@_reading
def series(conn: sqlite3.Connection, gpu: int, since: Optional[float] = None) -> List[Tuple[float, Optional[int]]]:
    """(taken_at, free bytes) of one GPU, in sample order (ids, not clock: clocks jump)."""
    where, args = "g.gpu = ?", [gpu]
    if since is not None:
        where += " AND s.taken_at >= ?"
        args.append(since)
    return [(_typed(TIME_REQUIRED, row[0], "samples.taken_at"), _typed(BYTES, row[1], "gpu_samples.free_bytes"))
            for row in conn.execute("SELECT s.taken_at, g.free_bytes FROM gpu_samples g JOIN samples s ON "
                                    "s.id = g.sample_id WHERE {} ORDER BY s.id".format(where), args)]


def read_window(conn: sqlite3.Connection, since: float) -> Tuple[List[RunStats], Dict[int, List[Optional[int]]]]:
    """What ``history`` shows: the runs with samples since ``since``, and each GPU's free memory over it."""
    stats = [run_stats(conn, rid, since=since) for rid in runs(conn, since=since)]
    plots: Dict[int, List[Optional[int]]] = {}
    for r in stats:
        for lw in r.gpus:
            if lw.gpu not in plots:
                plots[lw.gpu] = [v for _, v in series(conn, lw.gpu, since=since)]
    return stats, plots


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
