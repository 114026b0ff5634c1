"""Hostile files at --db: record and history take only our own history, and type every value they read.

record runs as root from cron: a typo in --db must never move, write or open anything that is not a
kvforensics history. Each refusal is one line on stderr and exit 2, and the path is left exactly as it
was (same inode, same mtime, same content; a FIFO is never opened). Our own damaged history is still
moved aside by record; history says it is corrupt (exit 2)."""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import sqlite3
import stat
from pathlib import Path
from typing import Any, Callable, Dict

import pytest

from kvforensics.agent.history import store as history
from tests.conftest import ROOT, run_cli

SEED_NODE = ROOT / "examples" / "seed-node.json"
LEFT = "it was left as it is"


@pytest.fixture
def replay(monkeypatch) -> Dict[str, Any]:
    """record's collector replays the seed node's snapshot (made on the fake node): no processes needed."""
    from kvforensics.collectors import snapshot

    snap = json.loads(SEED_NODE.read_text())
    snap.pop("engine_log", None)  # the log analysis is not what these tests are about, and it is slow
    monkeypatch.setattr(snapshot, "collect", lambda **kw: copy.deepcopy(snap))
    monkeypatch.setattr(snapshot, "collect_each", lambda **kw: [copy.deepcopy(snap)])
    return snap


@pytest.fixture(autouse=True)
def never_hangs():
    """A FIFO opened for reading would block for ever: fail instead."""
    def hung(signum, frame):
        raise AssertionError("blocked (a FIFO opened?)")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def record(db: Path, *extra: str):
    return run_cli(["record", "--db", str(db), "--no-http", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"]
                   + list(extra))


def state(path: Path) -> Any:
    """Everything a command could change at ``path``, without opening anything but regular files."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        content: Any = os.readlink(path)
    elif stat.S_ISDIR(st.st_mode):
        content = sorted((p.name, state(p)) for p in path.iterdir())
    elif stat.S_ISREG(st.st_mode):
        content = path.read_bytes()
    else:
        content = None
    return st.st_ino, st.st_mode, st.st_mtime_ns, st.st_size, content


def folder(path: Path) -> Any:
    return sorted((p.name, state(p)) for p in path.parent.iterdir())


def _sqlite(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(str(path), isolation_level=None)
    for s in statements:
        conn.execute(s)
    conn.close()


def _directory(p: Path) -> None:
    p.mkdir()
    (p / "keep.conf").write_text("a system file\n")


def _unix_socket(p: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    s.close()  # the socket file stays


def _symlink_to(make: Callable[[Path], None]) -> Callable[[Path], None]:
    def build(p: Path) -> None:
        target = p.parent / "target"
        make(target)
        p.symlink_to(target)
    return build


HOSTILE = {
    "directory": (_directory, "is a directory"),
    "fifo": (lambda p: os.mkfifo(str(p)), "is a FIFO"),
    "socket": (_unix_socket, "is a socket"),
    "symlink to a character device": (lambda p: p.symlink_to("/dev/null"), "is a symlink to a character device"),
    "symlink to a directory": (_symlink_to(_directory), "is a symlink to a directory"),
    "symlink to a fifo": (_symlink_to(lambda t: os.mkfifo(str(t))), "is a symlink to a FIFO"),
    "dangling symlink": (lambda p: p.symlink_to(p.parent / "nothing-here"), "is a symlink to nothing"),
    "text file": (lambda p: p.write_text("root:x:0:0:root:/root:/bin/bash\n"), "is not an SQLite database"),
    "sqlite header only": (lambda p: p.write_bytes(b"SQLite format 3\x00" + b"\x00" * 20), "not an SQLite database"),
    "another program's sqlite": (lambda p: _sqlite(p, "CREATE TABLE invoices (id INTEGER, amount REAL)",
                                                   "INSERT INTO invoices VALUES (1, 9.5)"),
                                 "is another program's SQLite database (tables: invoices)"),
    "another program's sqlite, wal mode": (lambda p: _sqlite(p, "PRAGMA journal_mode = WAL", "CREATE TABLE t (x)"),
                                           "is another program's SQLite database (tables: t)"),
    "another program's application_id": (lambda p: _sqlite(p, "PRAGMA application_id = 305419896",
                                                           "CREATE TABLE runs (id INTEGER)"),
                                         "another program's SQLite database (application_id 0x12345678)"),
    "our tables but one column differs, no application_id": (
        lambda p: _sqlite(p, *[s for m in history.MIGRATIONS for s in m.replace("free_bytes", "free").split(";")
                               if s.strip()] + ["PRAGMA user_version = 3"]),
        "another program's SQLite database"),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_what_is_not_our_history_is_refused_and_left_as_it_is(tmp_path, kind):
    make, words = HOSTILE[kind]
    db = tmp_path / "h.db"
    make(db)
    before = folder(db)
    for argv in (None, ["history"], ["history", "--json"]):
        code, out, err = record(db) if argv is None else run_cli(argv + ["--db", str(db)])
        assert code == 2, (argv, err)
        assert err.count("\n") == 1 and words in err and LEFT in err, err
        assert "Traceback" not in err and out == ""
        assert folder(db) == before  # the path, and no lock or aside file beside it
    if kind == "directory":
        assert db.is_dir() and (db / "keep.conf").read_text() == "a system file\n"


@pytest.mark.parametrize("sibling,make,words", [
    ("-wal", _directory, "h.db-wal is a directory"),
    ("-shm", lambda p: p.symlink_to("/etc/hostname"), "h.db-shm is a symlink"),
    ("-journal", lambda p: os.mkfifo(str(p)), "h.db-journal is a FIFO"),
])
def test_sqlite_files_beside_it_must_be_plain_files(tmp_path, replay, sibling, make, words):
    db = tmp_path / "h.db"
    assert record(db)[0] == 0
    make(tmp_path / ("h.db" + sibling))
    before = folder(db)
    code, out, err = record(db)
    assert code == 2 and words in err and err.count("\n") == 1, err
    assert folder(db) == before


@pytest.mark.parametrize("make,words", [
    (lambda p, t: p.symlink_to(t), "h.db.lock is a symlink"),
    (lambda p, t: os.mkfifo(str(p)), "h.db.lock is a FIFO"),
    (lambda p, t: os.link(str(t), str(p)), "h.db.lock is a second name of another file"),
])
def test_the_lock_file_is_never_written_through(tmp_path, make, words):
    precious = tmp_path / "precious"
    precious.write_text("do not truncate\n")
    make(tmp_path / "h.db.lock", precious)
    before = folder(precious)
    code, out, err = record(tmp_path / "h.db")
    assert code == 2 and words in err and err.count("\n") == 1, err
    assert folder(precious) == before and precious.read_text() == "do not truncate\n"


def _history_json(db: Path) -> dict:
    code, out, err = run_cli(["history", "--db", str(db), "--json"])
    assert code == 0, err
    return json.loads(out)


def test_an_empty_file_is_initialised_in_place(tmp_path, replay):
    db = tmp_path / "h.db"
    db.write_bytes(b"")
    inode = db.stat().st_ino
    code, out, err = run_cli(["history", "--db", str(db)])
    assert code == 2 and "no history yet" in err
    assert record(db)[0] == 0
    assert db.stat().st_ino == inode and _history_json(db)["runs"][0]["samples"] == 1


def test_an_sqlite_file_with_nothing_in_it_is_initialised(tmp_path, replay):
    """What a record killed between creating the file and its first tables leaves."""
    db = tmp_path / "h.db"
    _sqlite(db, "PRAGMA journal_mode = WAL")
    assert db.stat().st_size > 0
    code, out, err = record(db)
    assert code == 0 and err == "", err
    assert _history_json(db)["runs"][0]["samples"] == 1


def _older_history(db: Path, version: int) -> None:
    """A history as a kvforensics without PRAGMA application_id would have left it."""
    conn = sqlite3.connect(str(db), isolation_level=None)
    for step in history.MIGRATIONS[:version]:
        conn.executescript(step)
    conn.execute("PRAGMA user_version = {}".format(version))
    conn.execute("INSERT INTO runs (id, run_key, first_seen, last_seen) VALUES (7, 'older', 1.7e9, 1.7e9 + 60)")
    conn.execute("INSERT INTO samples (id, run_id, taken_at, collected) VALUES (1, 7, 1.7e9, 1)")
    conn.execute("INSERT INTO gpu_samples (sample_id, gpu, free_bytes) VALUES (1, 0, 1000)")
    conn.close()


@pytest.mark.parametrize("version", [1, 2, 3])
def test_an_older_history_without_application_id_is_ours_and_stamped(tmp_path, replay, version):
    db = tmp_path / "h.db"
    _older_history(db, version)
    if version == history.SCHEMA_VERSION:  # history reads it as it is, and writes nothing
        before = state(db)
        code, out, err = run_cli(["history", "--db", str(db), "--since", "100w"])
        assert code == 0 and "older" in out and state(db) == before, err
    code, out, err = record(db, "--keep", "forever")
    assert code == 0 and "moved aside" not in err, err
    conn = sqlite3.connect(str(db))
    assert conn.execute("PRAGMA application_id").fetchone()[0] == history.APP_ID
    assert conn.execute("PRAGMA user_version").fetchone()[0] == history.SCHEMA_VERSION
    assert conn.execute("SELECT run_key FROM runs WHERE id = 7").fetchone()[0] == "older"
    conn.close()


def _ours_then(db: Path, damage: Callable[[Path], None]) -> bytes:
    assert record(db)[0] == 0
    damage(db)
    return db.read_bytes()


def _garbage_after_the_header(db: Path) -> None:
    data = bytearray(db.read_bytes())
    data[100:] = b"\xa5" * (len(data) - 100)
    db.write_bytes(bytes(data))


def _schema_text(sql: str) -> Callable[[Path], None]:
    def damage(db: Path) -> None:
        _sqlite(db, "PRAGMA writable_schema = ON",
                "UPDATE sqlite_master SET sql = {} WHERE name = 'gpu_samples'".format(sql))
    return damage


OWN_DAMAGE = {
    "pages overwritten": (_garbage_after_the_header, "unreadable as SQLite"),
    # the case: SQLite's message quotes the bad token, which is not UTF-8
    "CREATE statement not UTF-8": (_schema_text("CAST(X'435245415445205441424C45206770755F73616D706C6573202827FF'"
                                                " AS TEXT)"), "unreadable as SQLite"),
    "column renamed in the schema text": (_schema_text("replace(sql, 'free_bytes', 'free_bytez')"),
                                          "its tables are not those of schema 3 (gpu_samples differs)"),
    "a table dropped": (lambda db: _sqlite(db, "DROP TABLE engine_samples"), "engine_samples differs"),
    "the tables dropped": (lambda db: _sqlite(db, "DROP TABLE engine_samples", "DROP TABLE gpu_samples",
                                              "DROP TABLE samples", "DROP TABLE runs"), "runs, samples differs"),
}


@pytest.mark.parametrize("damage", sorted(OWN_DAMAGE))
def test_our_own_damaged_history_history_says_so_and_record_moves_it_aside(tmp_path, replay, damage):
    db = tmp_path / "h.db"
    make, why = OWN_DAMAGE[damage]
    original = _ours_then(db, make)
    for argv in (["history"], ["history", "--json"]):
        code, out, err = run_cli(argv + ["--db", str(db)])
        assert code == 2 and "the history is corrupt" in err and why in err and err.count("\n") == 1, err
        assert out == "" and db.read_bytes() == original
    code, out, err = record(db)
    assert code == 0 and "was not usable and was moved aside" in err and why in err, err
    (aside,) = [p for p in tmp_path.iterdir() if ".unusable-" in p.name and not p.name.endswith(history.SIBLINGS)]
    assert aside.read_bytes() == original
    assert _history_json(db)["runs"][0]["samples"] == 1


def test_asides_in_the_same_second_never_overwrite_each_other(tmp_path, replay, monkeypatch):
    monkeypatch.setattr(history.time, "strftime", lambda fmt: "20260101T000000")
    db = tmp_path / "h.db"
    firsts = []
    for _ in range(3):
        firsts.append(_ours_then(db, _garbage_after_the_header))
        assert record(db)[0] == 0
    asides = sorted(p.name for p in tmp_path.iterdir() if ".unusable-" in p.name)
    assert asides == ["h.db.unusable-20260101T000000", "h.db.unusable-20260101T000000-1",
                      "h.db.unusable-20260101T000000-2"]
    assert [(tmp_path / a).read_bytes() for a in asides] == firsts


# --- item 2: every value read is typed ------------------------------------------------------

def _poke(db: Path, *statements: str) -> None:
    _sqlite(db, *statements)


BAD_VALUES = {
    "year 10000": ("runs", "first_seen", "253402300800"),
    "1e18 seconds": ("runs", "last_seen", "1e18"),
    "1e308": ("samples", "taken_at", "1e308"),
    "inf": ("runs", "first_seen", "9e999"),
    "-inf": ("samples", "taken_at", "-9e999"),  # before any window: history does not read it, record does
    "text time": ("samples", "taken_at", "'yesterday'"),
    "text bytes": ("gpu_samples", "free_bytes", "'lots'"),
    "blob bytes": ("gpu_samples", "free_bytes", "X'00FF'"),
    "negative bytes": ("gpu_samples", "free_bytes", "-1"),
    "float bytes": ("gpu_samples", "free_bytes", "1.5"),
    "huge bytes": ("gpu_samples", "free_bytes", "9223372036854775807"),
    "GPU -2": ("gpu_samples", "gpu", "-2"),
    "text tokens": ("engine_samples", "kv_tokens", "'many'"),
    "usage inf": ("engine_samples", "token_usage", "9e999"),
    "blob model": ("runs", "model", "X'00FF'"),
    "control characters in a rank": ("gpu_samples", "rank", "'TP0' || char(27) || '[2J'"),
    "text run key": ("runs", "run_key", "X'01'"),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_a_value_no_kvforensics_writes_is_corrupt(tmp_path, replay, case):
    table, column, value = BAD_VALUES[case]
    db = tmp_path / "h.db"
    assert record(db)[0] == 0
    _poke(db, "INSERT INTO engine_samples (sample_id, kv_tokens) SELECT MAX(id), 1000 FROM samples",
          "UPDATE {0} SET {1} = {2} WHERE rowid = (SELECT MIN(rowid) FROM {0})".format(table, column, value))
    original = db.read_bytes()
    for argv in (["history"], ["history", "--json"]):
        code, out, err = run_cli(argv + ["--db", str(db)])
        if case == "-inf":
            assert code == 0 and "0 engine run(s)" in " ".join(out.split()) or json.loads(out)["runs"] == [], out
            continue
        assert code == 2 and "the history is corrupt" in err and "{}.{}".format(table, column) in err, err
        assert err.count("\n") == 1 and out == ""
    code, out, err = record(db)  # the same engine run: record reads these rows, so it moves the file aside
    assert code == 0 and "moved aside" in err and "{}.{}".format(table, column) in err, err
    (aside,) = [p for p in tmp_path.iterdir() if ".unusable-" in p.name and not p.name.endswith(history.SIBLINGS)]
    assert aside.read_bytes() == original and _history_json(db)["runs"][0]["samples"] == 1


def test_markup_in_a_rank_is_shown_as_text(tmp_path, replay):
    db = tmp_path / "h.db"
    assert record(db)[0] == 0
    _poke(db, "UPDATE gpu_samples SET rank = '[/bold] [red]x' WHERE gpu = 3")
    code, out, err = run_cli(["history", "--db", str(db), "--no-color"])
    assert code == 0 and "[/bold] [red]x" in out, err


def test_the_writer_stores_only_what_readers_take(tmp_path):
    """A driver's nonsense figure is stored as unknown, not as history that later reads as corrupt."""
    opened = history.open_db(str(tmp_path / "h.db"))
    now = 1.75e9
    rid = history.upsert_run(opened.conn, "r", now, model="m\x1b[2J", mem_fraction_static=float("inf"),
                             pre_load_free_bytes=-5)
    history.add_sample(opened.conn, rid, now, True,
                       [{"gpu": 0, "free_bytes": 1 << 62, "rank": "TP0"}, {"gpu": 70000, "free_bytes": 1},
                        {"gpu": 1, "free_bytes": 2.5}],
                       {"kv_tokens": -1, "token_usage": float("nan"), "used_tokens": 10})
    stats = history.run_stats(opened.conn, rid)
    assert stats.model is None and [(g.gpu, g.min_free_bytes) for g in stats.gpus] == [(0, None), (1, None)]
    assert stats.kv_tokens is None and stats.peak_token_usage is None and stats.peak_used_tokens == 10
    with pytest.raises(history.HistoryError, match="the clock reads"):
        history.add_sample(opened.conn, rid, 1e300, True, [], None)
    opened.conn.close()


def test_a_file_moved_aside_is_the_file_found_not_one_record_began_to_write(tmp_path, replay):
    """An older history (no application_id) whose values fail: record reads before it stamps, migrates
    or switches to WAL, so the file moved aside is byte for byte the one that was there."""
    db = tmp_path / "h.db"
    _older_history(db, 1)
    _poke(db, "UPDATE samples SET taken_at = 'soon'")
    original = db.read_bytes()
    code, out, err = record(db)
    assert code == 0 and "moved aside" in err and "samples.taken_at holds 'soon'" in err, err
    (aside,) = [p for p in tmp_path.iterdir() if ".unusable-" in p.name and not p.name.endswith(history.SIBLINGS)]
    assert aside.read_bytes() == original


@pytest.mark.parametrize("damage,why", [
    (lambda db: _poke_bytes(db, 18, b"\x07"), "its SQLite header is damaged"),  # SQLite would open it read-only
    (lambda db: _poke(db, "PRAGMA user_version = -1"), "schema version -1"),
])
def test_a_damaged_header_is_corrupt_not_read_only(tmp_path, replay, damage, why):
    db = tmp_path / "h.db"
    assert record(db)[0] == 0
    damage(db)
    code, out, err = run_cli(["history", "--db", str(db)])
    assert code == 2 and "the history is corrupt" in err and why in err, err
    code, out, err = record(db)
    assert code == 0 and "moved aside" in err and why in err, err


def _poke_bytes(db: Path, offset: int, data: bytes) -> None:
    with open(str(db), "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.mark.parametrize("kind", ["directory", "fifo", "another program's sqlite"])
def test_inspect_reads_no_history_from_what_is_not_ours(tmp_path, replay, kind):
    from kvforensics.agent.history.record import local_history

    db = tmp_path / "h.db"
    HOSTILE[kind][0](db)
    before = folder(db)
    snap, recorded = local_history(str(db), replay)
    assert recorded is None and snap is replay
    assert folder(db) == before


# --- --prom-file: only our own textfile is replaced (reports/textfile.py) ------------------------------------

SMARTMON = ("# HELP smartmon_device_active SMART metric device_active\n# TYPE smartmon_device_active gauge\n"
            'smartmon_device_active{disk="/dev/sda"} 1\n')
NOT_OUR_TEXTFILE = {
    "directory": (_directory, "is a directory"),
    "fifo": (lambda p: os.mkfifo(str(p)), "is a FIFO"),
    "socket": (_unix_socket, "is a socket"),
    "symlink to our own textfile": (_symlink_to(lambda t: t.write_text("kvforensics_up 1\n")), "is a symbolic link"),
    "dangling symlink": (lambda p: p.symlink_to(p.parent / "nothing-here"), "is a symbolic link"),
    "symlink to a character device": (lambda p: p.symlink_to("/dev/null"), "is a symbolic link"),
    "another exporter's textfile": (lambda p: p.write_text(SMARTMON),
                                    "holds another exporter's metric smartmon_device_active"),
    "ours, then another exporter's sample": (lambda p: p.write_text("kvforensics_up 1\nnode_textfile_x 2\n"),
                                             "holds another exporter's metric node_textfile_x"),
    "binary": (lambda p: p.write_bytes(b"\xff\xfe\x00kvforensics_up 1\n"), "is not a Prometheus textfile"),
    "a big file": (lambda p: _sparse(p, 5 << 20), "is larger"),
}


def _sparse(p: Path, size: int) -> None:
    p.touch()
    os.truncate(str(p), size)


@pytest.mark.parametrize("kind", sorted(NOT_OUR_TEXTFILE))
def test_what_is_not_our_textfile_is_refused_before_sampling_and_left_as_it_is(tmp_path, replay, kind):
    make, words = NOT_OUR_TEXTFILE[kind]
    prom = tmp_path / "textfiles" / "k.prom"
    prom.parent.mkdir()
    make(prom)
    before = folder(prom)
    code, out, err = record(tmp_path / "h.db", "--prom-file", str(prom))
    assert code == 2 and err.count("\n") == 1 and words in err and "it was left as it is" in err, err
    assert "Traceback" not in err and out == ""
    assert folder(prom) == before  # the path, and no temporary file beside it
    assert not (tmp_path / "h.db").exists()  # refused before sampling: no history either


def test_only_a_file_that_is_provably_ours_is_replaced(tmp_path, replay):
    """What record writes begins with its header and is replaced by the next run; a textfile an older
    release wrote (kvforensics_ metrics declared, no header) is ours too; a missing path is made."""
    from kvforensics.reports.textfile import HEADER

    prom = tmp_path / "k.prom"
    code, _, err = record(tmp_path / "h.db", "--prom-file", str(prom))
    first = prom.read_text()
    assert code in (0, 3) and first.startswith(HEADER + "\n") and "kvforensics_" in first, err
    assert oct(prom.stat().st_mode & 0o777) == oct(0o644)
    code, _, err = record(tmp_path / "h.db", "--prom-file", str(prom))  # what record wrote is ours
    assert code in (0, 3) and "left as it is" not in err and prom.read_text().startswith(HEADER)
    prom.write_text("# HELP kvforensics_up Whether the last record run sampled.\n# TYPE kvforensics_up gauge\n"
                    "kvforensics_up 1\n")  # an older release's file
    code, _, err = record(tmp_path / "h.db", "--prom-file", str(prom))
    assert code in (0, 3) and "left as it is" not in err and prom.read_text().startswith(HEADER)


@pytest.mark.parametrize("text,words", [
    ("", "is an empty file (another program's, or a lock file)"),
    ("# a lock held by backup.sh\n# pid 4242\n", "holds no kvforensics metric (comments only)"),
    ("# hosts.allow: list of hosts that are allowed to access the system\n", "holds no kvforensics metric"),
])
def test_an_empty_or_comments_only_file_is_not_ours(tmp_path, replay, text, words):
    prom = tmp_path / "k.prom"
    prom.write_text(text)
    code, out, err = record(tmp_path / "h.db", "--prom-file", str(prom))
    assert code == 2 and words in err and "it was left as it is" in err and prom.read_text() == text


def test_a_textfile_swapped_for_another_during_the_run_is_not_replaced(tmp_path, monkeypatch):
    from kvforensics.reports import textfile

    prom = tmp_path / "k.prom"
    prom.write_text(SMARTMON)  # what another tool put there after record's first look
    with pytest.raises(textfile.Refused, match="smartmon_device_active"):
        textfile.write(str(prom), None)  # checked again just before the rename
    assert prom.read_text() == SMARTMON
