"""A seeded mutation campaign over history databases: whatever a history file holds, `history` (text and
--json) and `record` exit with a documented code (never 4), print JSON valid against the published
history schema, and change no path they were not asked to write.

Each case starts from a real history (samples written by the history module and by `record`, replaying
the seed node's snapshot made on the fake node), applies one to three mutations (tables dropped,
columns renamed for real or in the schema text, hostile values in cells, the file truncated, bytes
flipped, another application_id or schema version), then runs the three commands. Seeded: a failure
names its case, and `KVF_MUTATION_CASES=N` runs more of them."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import random
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import pytest

from tests.conftest import ROOT, run_cli

CASES = int(os.environ.get("KVF_MUTATION_CASES", "300"))
SEED_NODE = ROOT / "examples" / "seed-node.json"
APP_ID = 0x4B564653
EXITS = {"history": {0, 2}, "record": {0, 2, 3}}  # README "Exit codes"; 4 is a bug
TABLES = {"runs": ("run_key", "host", "engine", "started_at", "first_seen", "last_seen", "version_hint", "model",
                   "mem_fraction_static", "pre_load_free_bytes", "bytes_per_token", "port", "namespace", "pod",
                   "container"),
          "samples": ("run_id", "taken_at", "collected"),
          "gpu_samples": ("sample_id", "gpu", "uuid", "rank", "total_bytes", "reserved_bytes", "used_bytes",
                          "free_bytes", "engine_used_bytes", "pci_bus_id", "name"),
          "engine_samples": ("kv_tokens", "used_tokens", "token_usage", "running", "queued"),
          "startups": ("run_id", "read_at", "section")}
HOSTILE_VALUES = ("'text'", "''", "X'00FF'", "X''", "1e308", "-1e308", "9e999", "-9e999", "-1", "0",
                  "9223372036854775807", "-9223372036854775808", "1e18", "253402300800", "1.5", "NULL", "'9e999'",
                  "char(27) || '[2J'", "'[/bold]'", "hex(randomblob(6000))", "randomblob(6000)", "-2", "'TP0'",
                  "1800000000", "'-5'", "0.5")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> bytes:
    """A real history: this node's engine run (GPU and engine rows from the history module, then two
    samples by `record`), an older run without an engine, and one outside the default window."""
    from kvforensics.agent.history import store as history
    from kvforensics.agent.history.record import run_key

    snap = _snapshot()
    db = tmp_path_factory.mktemp("base") / "h.db"
    opened = history.open_db(str(db))
    now = time.time()
    runs = ((run_key(snap), now - 3600, 4, True), ("no-engine:older", now - 2 * 86400, 3, False),
            ("sglang:gone", now - 9 * 86400, 2, True))
    for key, start, n, engine in runs:
        rid = history.upsert_run(opened.conn, key, start, engine="sglang-1" if engine else None, model="m")
        for i in range(n):
            at = start + 600 * i
            history.upsert_run(opened.conn, key, at)
            gpus = [{"gpu": g, "uuid": "GPU-{}".format(g), "rank": "TP{}".format(g) if engine else None,
                     "total_bytes": 96 << 30, "free_bytes": (5 << 30) - g * i * (1 << 28)} for g in range(4)]
            history.add_sample(opened.conn, rid, at, True, gpus,
                               {"kv_tokens": 159277, "used_tokens": 1000 * i, "token_usage": 0.1 * i,
                                "running": i, "queued": 0} if engine else None)
    opened.conn.close()
    with _replaying(snap):
        for _ in range(2):
            code, out, err = run_cli(["record", "--db", str(db), "--no-http"])
            assert code == 0 and err == "", err
    return db.read_bytes()


def _snapshot() -> Dict[str, Any]:
    snap = json.loads(SEED_NODE.read_text())
    snap.pop("engine_log", None)  # the log analysis is not what this is about, and it is slow
    return snap


class _replaying:
    """record's collector replays the seed snapshot; the command line is built once (typer takes ~30 ms
    to build it, the commands themselves a few ms), so hundreds of cases take seconds."""

    def __init__(self, snap: Dict[str, Any]) -> None:
        self.snap = snap

    def __enter__(self) -> "_replaying":
        import typer

        from kvforensics.collectors import snapshot

        self.saved = snapshot.collect_each, typer.main.get_command
        snapshot.collect_each = lambda **kw: [copy.deepcopy(self.snap)]
        typer.main.get_command = functools.lru_cache(maxsize=None)(typer.main.get_command)
        return self

    def __exit__(self, *exc: object) -> None:
        import typer

        from kvforensics.collectors import snapshot

        snapshot.collect_each, typer.main.get_command = self.saved


# --- mutations -----------------------------------------------------------------------------

def _sql(db: Path, *statements: str) -> None:
    conn = sqlite3.connect(str(db), isolation_level=None)
    try:
        for s in statements:
            conn.execute(s)
    except (sqlite3.Error, UnicodeDecodeError):
        pass  # a mutation SQLite refuses (a text id, a file already broken) leaves the file as it was
    finally:
        conn.close()


def drop_table(db: Path, rng: random.Random) -> str:
    table = rng.choice(sorted(TABLES))
    _sql(db, "DROP TABLE {}".format(table))
    return "drop {}".format(table)


def rename_column(db: Path, rng: random.Random) -> str:
    table = rng.choice(sorted(TABLES))
    column = rng.choice(TABLES[table])
    _sql(db, "ALTER TABLE {} RENAME COLUMN {} TO {}_x".format(table, column, column))
    return "rename {}.{}".format(table, column)


def schema_text(db: Path, rng: random.Random) -> str:
    """The column renamed in sqlite_master's text only: quick_check still passes."""
    table = rng.choice(sorted(TABLES))
    column = rng.choice(TABLES[table])
    _sql(db, "PRAGMA writable_schema = ON", "UPDATE sqlite_master SET sql = replace(sql, '{0}', '{0}z') WHERE name = "
             "'{1}'".format(column, table))
    return "schema text {}.{}".format(table, column)


def cell(db: Path, rng: random.Random) -> str:
    table = rng.choice(sorted(TABLES))
    column = rng.choice(TABLES[table])
    value = rng.choice(HOSTILE_VALUES)
    rows = "1" if rng.random() < 0.3 else "rowid = (SELECT rowid FROM {} ORDER BY random() LIMIT 1)".format(table)
    _sql(db, "UPDATE {} SET {} = {} WHERE {}".format(table, column, value, rows))
    return "{}.{} = {} where {}".format(table, column, value, rows.split(" ")[0])


def truncate(db: Path, rng: random.Random) -> str:
    size = db.stat().st_size
    length = rng.choice([0, 50, 100, 4096, rng.randrange(size + 1), rng.randrange(size + 1)])
    with open(str(db), "r+b") as f:
        f.truncate(min(length, size))
    return "truncate to {}".format(length)


def flip(db: Path, rng: random.Random) -> str:
    data = bytearray(db.read_bytes())
    if not data:
        return "flip nothing"
    spots = [rng.randrange(100 if rng.random() < 0.3 else len(data)) % len(data) for _ in range(rng.randint(1, 8))]
    for i in spots:
        data[i] ^= rng.randrange(1, 256)
    db.write_bytes(bytes(data))
    return "flip bytes {}".format(sorted(spots))


def pragma(db: Path, rng: random.Random) -> str:
    name, value = rng.choice([("application_id", v) for v in (0, 1, APP_ID + 1, 0x12345678)]
                             + [("user_version", v) for v in (0, 1, 3, 99, -1)])
    _sql(db, "PRAGMA {} = {}".format(name, value))
    return "{} = {}".format(name, value)


def rows(db: Path, rng: random.Random) -> str:
    statement = rng.choice(["DELETE FROM runs", "DELETE FROM samples WHERE id % 2 = 0",
                            "INSERT INTO samples (run_id, taken_at, collected) VALUES (999, 1.8e9, 1)",
                            "INSERT INTO gpu_samples (sample_id, gpu, free_bytes) VALUES (999, 0, 5)",
                            "CREATE TABLE extra (x)", "DELETE FROM gpu_samples"])
    _sql(db, statement)
    return statement


MUTATIONS: List[Callable[[Path, random.Random], str]] = [drop_table, rename_column, schema_text, cell, cell, cell,
                                                         truncate, flip, flip, pragma, rows]


# --- the campaign --------------------------------------------------------------------------

def _files(folder: Path) -> Dict[str, Tuple[int, int, str]]:
    out = {}
    for p in sorted(folder.iterdir()):
        st = p.lstat()
        out[p.name] = (st.st_ino, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def _ours(data: bytes) -> bool:
    """Whether record may take this file: empty, or SQLite with our application_id or none (an older
    history, or one whose stamp is still in its -wal)."""
    return not data or (data[:16] == b"SQLite format 3\x00" and int.from_bytes(data[68:72], "big") in (0, APP_ID))


def _check_history(case: str, db: Path, as_json: bool, problems: List[str]) -> None:
    before = _files(db.parent)
    code, out, err = run_cli(["history", "--db", str(db)] + (["--json"] if as_json else []))  # checks the schema
    if code not in EXITS["history"]:
        problems.append("{}: history{} exit {}: {}".format(case, " --json" if as_json else "", code, err.strip()))
    if code == 2 and (err.count("\n") != 1 or out):
        problems.append("{}: history exit 2 not one line: {!r}".format(case, err))
    if as_json and code == 0:
        json.loads(out, parse_constant=lambda c: problems.append("{}: {} in JSON".format(case, c)))
    if _files(db.parent) != before:
        problems.append("{}: history changed files: {}".format(case, sorted(set(_files(db.parent)) ^ set(before))))


def _check_record(case: str, db: Path, problems: List[str]) -> None:
    before = _files(db.parent)
    original = db.read_bytes() if db.exists() else b""
    code, out, err = run_cli(["record", "--db", str(db), "--no-http"])
    if code not in EXITS["record"]:
        problems.append("{}: record exit {}: {}".format(case, code, err.strip()))
    after = _files(db.parent)
    allowed = {"h.db", "h.db-wal", "h.db-shm", "h.db-journal", "h.db.lock"}
    changed = {n for n in set(before) | set(after) if before.get(n) != after.get(n)}
    asides = {n for n in changed if n.startswith("h.db.unusable-")}
    if changed - allowed - asides:
        problems.append("{}: record changed {}".format(case, sorted(changed - allowed - asides)))
    if "left as it is" in err and changed:
        problems.append("{}: record refused but changed {}".format(case, sorted(changed)))
    if not _ours(original) and (code == 0 or asides):
        problems.append("{}: record took a file that is not ours (exit {}, {})".format(case, code, err.strip()))
    moved = [n for n in asides if n.endswith(tuple("0123456789"))]
    if asides and (len(moved) != 1 or (db.parent / moved[0]).read_bytes() != original):
        problems.append("{}: the file moved aside is not the file that was there: {}".format(case, sorted(asides)))


def test_mutated_histories_never_crash_break_the_schema_or_touch_other_files(base, tmp_path):
    problems: List[str] = []
    started = time.time()
    with _replaying(_snapshot()):
        old = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(AssertionError("hung")))
        try:
            for i in range(CASES):
                signal.alarm(60)
                _one_case(i, base, tmp_path / str(i), problems)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
    assert not problems, "{} problem(s) in {} cases, e.g.:\n{}".format(len(problems), CASES, "\n".join(problems[:15]))
    assert time.time() - started < 600  # generous: only a hang would reach it


def _one_case(i: int, base: bytes, folder: Path, problems: List[str]) -> None:
    rng = random.Random(i)
    folder.mkdir()
    db = folder / "h.db"
    db.write_bytes(base)
    (folder / "neighbour.db").write_bytes(base)  # another file in the same folder: nobody may touch it
    done = [rng.choice(MUTATIONS)(db, rng) for _ in range(rng.choice((1, 1, 2, 3)))]
    case = "case {} ({})".format(i, "; ".join(done))
    _check_history(case, db, False, problems)
    _check_history(case, db, True, problems)
    _check_record(case, db, problems)
    _check_history(case + " after record", db, True, problems)
