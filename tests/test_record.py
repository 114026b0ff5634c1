"""Cron mode: record into SQLite history, low-water marks, Prometheus textfile, faults."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvforensics.agent.history import store as history
from tests.conftest import ROOT, run_cli
from tests.fakenode import FAKE_LIB, GIB, FakeNode, build_fake_nvml
from tests.loopback_http import serving


def _record(db, prom=None, *extra):
    argv = ["record", "--db", str(db), "--nvml-lib", str(FAKE_LIB), "--no-http"]
    if prom is not None:
        argv += ["--prom-file", str(prom)]
    return run_cli(argv + list(extra))


def _set_free(node, free_gib):
    node.free = [int(f * GIB) for f in free_gib]
    node.write_scenario()


def test_low_water_marks_are_exact(node, tmp_path):
    db = tmp_path / "h.db"
    sequence = [[5.06] * 8, [5.06, 4.10, 5.06, 5.06, 3.20, 5.06, 5.06, 5.06], [5.5] * 8]
    for free in sequence:
        _set_free(node, free)
        code, out, err = _record(db)
        assert code == 0, err
    code, out, err = run_cli(["history", "--db", str(db), "--json"])
    doc = json.loads(out)
    (run,) = doc["runs"]
    assert run["samples"] == 3 and run["engine"] == "sglang-1" and run["kv_tokens"] == 159277
    lows = {g["gpu"]: g["min_free_bytes"] for g in run["gpus"]}
    assert lows == {i: min(int(s[i] * GIB) for s in sequence) for i in range(8)}
    assert {g["gpu"]: g["last_free_bytes"] for g in run["gpus"]} == {i: int(5.5 * GIB) for i in range(8)}
    assert [g["rank"] for g in run["gpus"]] == ["TP{}".format(i) for i in range(8)]


def test_recommendation_rests_on_the_low_water_mark(node, tmp_path):
    db = tmp_path / "h.db"
    for free in ([5.06] * 8, [5.06] * 4 + [3.71] + [5.06] * 3, [5.06] * 8):
        _set_free(node, free)
        _record(db)
    # inspect on the node reads the same history (read-only) and says so; three samples taken
    # within seconds are still one look: the low-water mark sizes the raise, the basis stays estimated
    rec, unused = _mem_fraction_advice(db)
    assert rec["basis"] == "estimated"
    assert "one look: 3 samples over" in rec["rationale"] and "lowest free 3.71 GiB on GPU 4" in rec["rationale"]
    pre = int(round(94.04 * GIB))
    assert float(rec["value"]) == int((0.88 + (int(3.71 * GIB) - 2 * GIB) / pre) * 1000) / 1000
    assert unused["bytes"] == int(3.71 * GIB) - 2 * GIB
    # the same samples spread over an hour are a measurement
    conn = sqlite3.connect(str(db))
    with conn:
        conn.execute("UPDATE runs SET first_seen = first_seen - 3600")
    conn.close()
    rec, unused = _mem_fraction_advice(db)
    assert rec["basis"] == "measured"
    assert "measured over 60 minutes, 3 samples: lowest free 3.71 GiB on GPU 4" in rec["rationale"]
    assert "measured over 60 minutes" in unused["detail"]


def test_a_cut_rests_on_a_measured_low_water_mark_below_the_margin_and_nothing_less(node, tmp_path):
    """1.20 GiB at the lowest, under the 2 GiB margin: within seconds it is one look, a note to watch (no cut);
    the same samples over an hour are evidence, and the KV budget gives back the shortfall, no more."""
    db = tmp_path / "h.db"
    for free in ([5.06] * 8, [5.06] * 2 + [1.20] + [5.06] * 5, [5.06] * 8):
        _set_free(node, free)
        _record(db)
    code, out, err = run_cli(["inspect", "--json", "--no-http", "--nvml-lib", str(FAKE_LIB), "--db", str(db)])
    t = json.loads(out)["targets"][0]
    low = next(f for f in t["findings"] if f["code"] == "low_headroom")
    assert low["severity"] == "info"
    assert not [r for r in t["recommendations"] if r["gain_bytes"] and r["gain_bytes"] < 0]
    conn = sqlite3.connect(str(db))
    with conn:
        conn.execute("UPDATE runs SET first_seen = first_seen - 3600")
    conn.close()
    code, out, err = run_cli(["inspect", "--json", "--no-http", "--nvml-lib", str(FAKE_LIB), "--db", str(db)])
    t = json.loads(out)["targets"][0]
    low = next(f for f in t["findings"] if f["code"] == "low_headroom")
    assert low["severity"] == "warning" and "measured over 60 minutes, 3 samples: lowest free 1.20 GiB on GPU 2" \
        in low["detail"]
    rec = next(r for r in t["recommendations"] if r["flag"] == "--mem-fraction-static")
    assert rec["basis"] == "measured" and "the low-water mark, measured over 60 minutes" in rec["rationale"]
    shortfall = 2 * GIB - int(1.20 * GIB)
    assert -rec["gain_bytes"] >= shortfall and -rec["gain_bytes"] < shortfall + int(0.001 * 94.04 * GIB) + (1 << 20)
    assert t["verdict"]["action_recommendation"] == 0 and t["verdict"]["symptom_finding"] == "low_headroom"


def _mem_fraction_advice(db):
    code, out, err = run_cli(["inspect", "--json", "--no-http", "--nvml-lib", str(FAKE_LIB), "--db", str(db)])
    t = json.loads(out)["targets"][0]
    rec = next(r for r in t["recommendations"] if r["flag"] == "--mem-fraction-static")
    return rec, next(f for f in t["findings"] if f["code"] == "unused_gpu_memory")


def test_a_restart_starts_a_new_run(tmp_path, monkeypatch):
    build_fake_nvml()
    db = tmp_path / "h.db"
    for i in range(2):
        with FakeNode(tmp_path / "node{}".format(i)) as n:
            monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
            _record(db)
    doc = json.loads(run_cli(["history", "--db", str(db), "--json"])[1])
    assert len(doc["runs"]) == 2 and all(r["samples"] == 1 for r in doc["runs"])


NAME_RULES = re.compile(r"^kvforensics_[a-z0-9_]+$")


def test_textfile_parses_and_follows_the_naming_rules(node, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    prom = tmp_path / "kvforensics.prom"
    code, out, err = _record(tmp_path / "h.db", prom, "--samples", "2", "--interval", "0")
    text = prom.read_text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, fam in families.items():
        assert NAME_RULES.match(name), name
        assert fam.type == "gauge"
        assert fam.documentation
        for s in fam.samples:
            assert s.timestamp is None
            assert "pid" not in s.labels
    assert not re.search(r"^\S+\{[^}]*\} \S+ \d+$", text, re.M)  # no sample timestamps
    def value(name, **labels):
        return next(s.value for s in families[name].samples if all(s.labels.get(k) == v for k, v in labels.items()))
    assert value("kvforensics_gpu_memory_total_bytes", gpu="3") == 97887 * (1 << 20)
    assert value("kvforensics_gpu_memory_free_bytes", gpu="3") == int(5.06 * GIB)
    assert value("kvforensics_gpu_memory_free_low_water_bytes", gpu="3", rank="TP3",
                 engine="sglang-1") == int(5.06 * GIB)
    assert value("kvforensics_engine_kv_pool_tokens", engine="sglang-1") == 159277
    assert value("kvforensics_engine_kv_pool_bytes", engine="sglang-1", rank="TP0") == int(round(10.42 * GIB))
    assert value("kvforensics_engine_unused_bytes", engine="sglang-1") == int(5.06 * GIB) - 2 * GIB
    assert value("kvforensics_engine_run_samples", engine="sglang-1") == 2
    assert value("kvforensics_findings", code="unused_gpu_memory", severity="warning") == 1
    assert value("kvforensics_collector_success", collector="nvml") == 1
    assert abs(value("kvforensics_last_success_timestamp_seconds") - time.time()) < 60
    for name in families:
        if name.endswith(("_bytes", "_seconds", "_tokens")):
            continue
        assert name in ("kvforensics_gpu_up", "kvforensics_findings", "kvforensics_collector_success",
                        "kvforensics_engine_run_samples", "kvforensics_engine_up", "kvforensics_engine_info",
                        "kvforensics_engine_kv_usage_ratio", "kvforensics_engine_requests_running",
                        "kvforensics_engine_requests_queued"), name


def test_kill_9_mid_record_leaves_textfile_and_database_whole(node, tmp_path):
    db, prom = tmp_path / "h.db", tmp_path / "k.prom"
    _record(db, prom)
    before = prom.read_text()
    env = dict(node.env(), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "kvforensics", "record", "--db", str(db), "--prom-file", str(prom),
                             "--nvml-lib", str(FAKE_LIB), "--no-http", "--samples", "200", "--interval", "0"],
                            env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    conn = sqlite3.connect(str(db))
    while time.time() < deadline and conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0] < 4:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    n = conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
    assert n >= 4
    # every sample row is complete: one gpu row per GPU
    assert conn.execute("SELECT COUNT(*) FROM gpu_samples").fetchone()[0] == 8 * n
    conn.close()
    assert prom.read_text() == before  # the textfile is written once, at the end, by rename
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("k.prom.")]
    code, out, err = _record(db, prom)  # and the next run carries on
    assert code == 0 and prom.read_text() != ""


def test_two_records_at_once(node, tmp_path):
    db = tmp_path / "h.db"
    env = dict(node.env(), PYTHONPATH=str(ROOT))
    first = subprocess.Popen([sys.executable, "-m", "kvforensics", "record", "--db", str(db), "--nvml-lib",
                              str(FAKE_LIB),
                              "--no-http", "--samples", "30", "--interval", "0.1"], env=env, cwd=str(ROOT),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = Path(str(db) + ".lock")
    deadline = time.time() + 20
    while time.time() < deadline and not (lock.exists() and lock.read_text().strip()):
        time.sleep(0.05)
    start = time.monotonic()
    code, out, err = _record(db)
    took = time.monotonic() - start
    first.kill()
    first.wait()
    assert code == 0 and "another kvforensics record is running (PID {})".format(first.pid) in err
    assert took < 5  # exits at once, does not wait


@pytest.mark.parametrize("content,why", [
    (b"this is not a database at all" * 100, "is not an SQLite database"),
    ("foreign", "is another program's SQLite database (tables: invoices)"),
])
def test_a_file_that_is_not_our_history_is_refused_and_left_as_it_is(node, tmp_path, content, why):
    db = tmp_path / "h.db"
    if content == "foreign":
        other = sqlite3.connect(str(db))
        other.execute("CREATE TABLE invoices (id INTEGER, amount REAL)")
        other.execute("INSERT INTO invoices VALUES (1, 9.5)")
        other.commit()
        other.close()
    else:
        db.write_bytes(content)
    original, before = db.read_bytes(), db.stat()
    code, out, err = _record(db)
    assert code == 2 and why in err and "it was left as it is" in err and err.count("\n") == 1, err
    assert db.read_bytes() == original and (db.stat().st_ino, db.stat().st_mtime_ns) == (before.st_ino,
                                                                                         before.st_mtime_ns)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.db", "node"]  # no lock, nothing moved aside


def test_our_own_corrupt_history_is_moved_aside(node, tmp_path):
    db = tmp_path / "h.db"
    assert _record(db)[0] == 0
    data = bytearray(db.read_bytes())
    data[100:] = b"\xa5" * (len(data) - 100)  # our header (application_id) survives; the pages do not
    db.write_bytes(bytes(data))
    code, out, err = _record(db)
    assert code == 0
    assert "was not usable and was moved aside" in err and "unreadable as SQLite" in err
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("h.db.unusable-") and not p.name.endswith(("-wal",
                                                                                                              "-shm"))]
    assert aside.read_bytes() == bytes(data)  # never silently overwritten
    assert json.loads(run_cli(["history", "--db", str(db), "--json"])[1])["runs"][0]["samples"] == 1


def test_read_only_location_is_a_clear_error(node):
    code, out, err = _record("/proc/kvforensics/history.db")
    assert code == 2 and "cannot create /proc/kvforensics" in err and err.count("\n") == 1


def test_history_without_a_database(tmp_path):
    code, out, err = run_cli(["history", "--db", str(tmp_path / "none.db")])
    assert code == 2 and "no history yet" in err


@pytest.mark.skipif(shutil.which("faketime") is None and not os.environ.get("CI"),
                    reason="needs faketime (CI installs it)")
def test_clock_going_backwards_does_not_break_windows(node, tmp_path):
    db = tmp_path / "h.db"
    env = dict(node.env(), PYTHONPATH=str(ROOT))
    base = [sys.executable, "-m", "kvforensics", "record", "--db", str(db), "--nvml-lib", str(FAKE_LIB), "--no-http"]
    for offset, free in (("+0d", 5.06), ("-3d", 3.5), ("+0d", 4.0)):  # the middle run sees a clock 3 days behind
        _set_free(node, [free] * 8)
        cmd = (["faketime", "-f", offset] if offset != "+0d" else []) + base
        proc = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    doc = json.loads(run_cli(["history", "--db", str(db), "--json", "--since", "1d"])[1])
    (run,) = doc["runs"]
    assert run["samples"] == 2  # the 3-days-ago sample is outside a 1-day window...
    doc = json.loads(run_cli(["history", "--db", str(db), "--json", "--since", "7d"])[1])
    assert doc["runs"][0]["samples"] == 3 and doc["runs"][0]["gpus"][0]["min_free_bytes"] == int(3.5 * GIB)
    code, out, err = run_cli(["history", "--db", str(db), "--no-color"])
    assert code == 0 and "3.50" in out


def test_keep_prunes_old_samples(tmp_path):
    opened = history.open_db(str(tmp_path / "h.db"))
    run_id = history.upsert_run(opened.conn, "r", 1000.0)
    for t in (1000.0, 2000.0, time.time()):
        history.add_sample(opened.conn, run_id, t, True, [{"gpu": 0, "free_bytes": int(t)}], None)
    assert history.prune(opened.conn, time.time() - 3600) == 2
    assert history.run_stats(opened.conn, run_id).samples == 1


def test_migrations_from_an_older_schema(tmp_path):
    path = str(tmp_path / "h.db")
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in history.MIGRATIONS[0].split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("PRAGMA application_id = {}".format(history.APP_ID))
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO runs (run_key, first_seen, last_seen) VALUES ('old', 1, 2)")
    conn.close()
    opened = history.open_db(path)
    assert opened.conn.execute("PRAGMA user_version").fetchone()[0] == history.SCHEMA_VERSION
    assert opened.conn.execute("SELECT run_key FROM runs").fetchone()[0] == "old"
    assert opened.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    opened.conn.execute("SELECT * FROM engine_samples").fetchall()
    opened.conn.close()


def test_newer_schema_is_refused(tmp_path):
    path = str(tmp_path / "h.db")
    history.open_db(path).conn.execute("PRAGMA user_version = 99")
    with pytest.raises(history.HistoryError, match="newer kvforensics"):
        history.open_db(path)


def test_bad_durations():
    for bad in ("7", "7x", "-1d", "d", "abc"):
        with pytest.raises(ValueError):
            history.parse_duration(bad)
    assert history.parse_duration("30d") == 30 * 86400 and history.parse_duration("90m") == 5400
    code, out, err = run_cli(["record", "--keep", "soon", "--db", "/tmp/x.db"])
    assert code == 2 and "--keep" in err


def test_watch_refreshes_and_leaves(node):
    code, out, err = run_cli(["watch", "--count", "2", "--interval", "0.05", "--nvml-lib", str(FAKE_LIB), "--no-http",
                              "--no-color"])
    assert code == 0 and "kvforensics watch" in out and "TP7" in out and "5.06" in out


def test_watch_sparklines_share_one_scale():
    """4.20 GiB free never draws taller than 5.06 GiB: every GPU's sparkline is on the scale of all."""
    import collections

    from kvforensics.reports import watch_view

    looks = watch_view.Looks(free={0: collections.deque([int(5.06 * GIB)] * 4),
                                   1: collections.deque([int(4.20 * GIB)] * 4),
                                   2: collections.deque([int(5.06 * GIB), int(4.20 * GIB), None, int(5.06 * GIB)])})
    lo, hi = watch_view.free_scale(looks)
    assert (lo, hi) == (int(4.20 * GIB), int(5.06 * GIB))
    assert [watch_view.spark(list(looks.free[g]), 30, lo, hi) for g in range(3)] == ["████", "▁▁▁▁", "█▁ █"]
    assert watch_view.spark([0.5, 0.82], 20, 0.0, 1.0) == "▅▇"  # KV usage: on 0–100 %


def test_watch_ctrl_c_leaves_cleanly(node):
    env = dict(node.env(), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "kvforensics", "watch", "--interval", "0.2", "--nvml-lib",
                             str(FAKE_LIB),
                             "--no-http", "--no-color"], env=env, cwd=str(ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    # Ctrl-C once it shows its first screen: a fixed sleep raced start-up on a loaded machine
    first = _first_line_with(proc, "kvforensics watch", timeout_s=60.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "kvforensics watch" in first + out


def _first_line_with(proc: subprocess.Popen, text: str, timeout_s: float) -> str:
    """What ``proc`` printed up to and including its first line holding ``text`` (or until it stopped)."""
    import select

    seen, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.5)[0]:
            line = proc.stdout.readline()
            seen.append(line)
            if not line or text in line:
                break
    return "".join(seen)


def test_alert_rules_parse_and_use_exported_metrics():
    import yaml

    rules = yaml.safe_load((ROOT / "deploy" / "kvforensics.rules.yml").read_text())
    exported = {"kvforensics_engine_unused_bytes", "kvforensics_gpu_memory_free_low_water_bytes", "kvforensics_gpu_up",
                "kvforensics_collector_success", "kvforensics_last_success_timestamp_seconds",
                "kvforensics_gpu_memory_free_min_bytes", "kvforensics_margin_bytes", "node_textfile_mtime_seconds",
                "kvforensics_findings", "kvforensics_engine_up"}
    names = set()
    for group in rules["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert set(rule) >= {"alert", "expr", "labels", "annotations"}
            assert rule["labels"]["severity"] in ("info", "warning", "critical")
            expr = rule["expr"]
            assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}")
            for metric in re.findall(r"\b(kvforensics_\w+|node_\w+)", expr):
                assert metric in exported, metric
                names.add(metric)
    assert {"kvforensics_engine_unused_bytes", "kvforensics_gpu_memory_free_min_bytes", "kvforensics_margin_bytes",
            "kvforensics_collector_success", "node_textfile_mtime_seconds"} <= names


def test_systemd_units_and_cron_line():
    service = (ROOT / "deploy" / "kvforensics-record.service").read_text()
    timer = (ROOT / "deploy" / "kvforensics-record.timer").read_text()
    cron = (ROOT / "deploy" / "kvforensics.cron").read_text()
    assert "Type=oneshot" in service and "kvforensics record" in service and "--prom-file" in service
    assert "OnUnitActiveSec=" in timer and "WantedBy=timers.target" in timer
    line = [x for x in cron.splitlines() if x and not x.startswith("#")][0]
    assert len(line.split()) >= 7 and "kvforensics record" in line


def test_peak_kv_usage_from_live_metrics(tmp_path, monkeypatch):
    import http.server

    usage = iter([(40000, 0.25, 3), (151000, 0.95, 20), (90000, 0.56, 9)])

    class Engine(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path != "/metrics":
                self.send_error(404)
                return
            used, ratio, running = next(usage)
            body = ("sglang:num_used_tokens{{tp_rank=\"0\"}} {}\nsglang:token_usage{{tp_rank=\"0\"}} {}\n"
                    "sglang:num_running_reqs{{tp_rank=\"0\"}} {}\nsglang:num_queue_reqs{{tp_rank=\"0\"}} 0\n").format(
                        used, ratio, running)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    build_fake_nvml()
    db = tmp_path / "h.db"
    with serving(Engine) as port, FakeNode(tmp_path / "node", extra_flags=["--port", str(port)]) as n:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
        code, out, err = run_cli(["record", "--db", str(db), "--nvml-lib", str(FAKE_LIB), "--samples", "3",
                                  "--interval", "0"])
        assert code == 0, err
    run = json.loads(run_cli(["history", "--db", str(db), "--json"])[1])["runs"][0]
    assert run["peak_used_tokens"] == 151000 and run["peak_token_usage"] == 0.95
    assert run["engine"] == "sglang-{}".format(port)


def _families(prom):
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(prom.read_text())}


def _sample(families, name, **labels):
    family = families.get(name)
    samples = family.samples if family is not None else ()
    return next((s for s in samples if all(s.labels.get(k) == v for k, v in labels.items())), None)


def test_a_run_that_collects_nothing_is_not_a_success(tmp_path, monkeypatch):
    """No NVIDIA library, no engine, no host memory to speak of: exit 3, nvml is a failing collector,
    and last_success is not written, so KvforensicsRecordNotRunning can fire."""
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(tmp_path / "none"))
    prom = tmp_path / "k.prom"
    code, out, err = run_cli(["record", "--db", str(tmp_path / "h.db"), "--nvml-lib", str(tmp_path / "absent.so"),
                              "--no-http", "--prom-file", str(prom)])
    fams = _families(prom)
    assert _sample(fams, "kvforensics_collector_success", collector="nvml").value == 0
    assert code == 3  # README "Exit codes": nothing could be collected (here: no GPU memory at all)
    if "collected nothing" in err:  # this machine has no host memory figures nor engine either
        assert "kvforensics_last_success_timestamp_seconds" not in fams and "recorded" not in out


def test_record_without_nvml_says_what_was_missing_and_exits_3(tmp_path):
    """record keeps GPU memory history: a run that sampled no GPU says why in one line on stderr, also with
    --quiet (cron mails it), and exits 3; the sample and the textfile are still written (the nvml collector
    fails there, for KvforensicsCollectorFailing)."""
    lib = tmp_path / "absent.so"
    for quiet in ([], ["--quiet"]):
        code, out, err = run_cli(["record", "--db", str(tmp_path / "h.db"), "--nvml-lib", str(lib), "--no-http",
                                  "--prom-file", str(tmp_path / "k.prom")] + quiet)
        assert code == 3
        line = "kvforensics: record sampled no GPU (cannot load {0}: {0}: cannot open shared object file: No such " \
            "file or directory): the samples hold host memory and engine processes only\n".format(lib)
        assert err == line or "collected nothing" in err  # (a machine without /proc/meminfo: nothing at all)
        assert out.startswith("recorded 1 sample(s) into ") if not quiet else out == ""
        assert (tmp_path / "k.prom").exists()


def test_the_low_water_alert_reads_this_runs_minimum_and_the_margin(node, tmp_path):
    prom = tmp_path / "k.prom"
    _set_free(node, [5.06] * 8)
    code, out, err = _record(tmp_path / "h.db", prom, "--margin", "3")
    fams = _families(prom)
    assert _sample(fams, "kvforensics_margin_bytes").value == 3 * GIB
    assert _sample(fams, "kvforensics_gpu_memory_free_min_bytes", gpu="2", rank="TP2",
                   engine="sglang-1").value == int(5.06 * GIB)


def test_a_lost_gpu_keeps_its_labels_and_stops_the_unused_figure(node, tmp_path):
    db, prom = tmp_path / "h.db", tmp_path / "k.prom"
    _record(db, prom)
    uuid = _sample(_families(prom), "kvforensics_gpu_up", gpu="5").labels["uuid"]
    assert uuid.startswith("GPU-")
    text = node.scenario.read_text().splitlines()
    node.scenario.write_text("\n".join(x + " state=lost" if x.startswith("gpu 5 ") else x for x in text) + "\n")
    _record(db, prom)
    fams = _families(prom)
    lost = _sample(fams, "kvforensics_gpu_up", gpu="5")
    assert lost.value == 0 and lost.labels["uuid"] == uuid  # the same series as before, not a new one
    assert _sample(fams, "kvforensics_engine_unused_bytes") is None  # never "unused" beside a lost GPU
    assert _sample(fams, "kvforensics_findings", code="gpu_lost").value == 1


def test_a_clock_400_days_ahead_does_not_erase_the_history(node, tmp_path, monkeypatch):
    db = tmp_path / "h.db"
    for _ in range(3):
        _record(db)
    from kvforensics.agent.history import store as h

    jumped = time.time() + 400 * 86400
    monkeypatch.setattr(h.time, "time", lambda: jumped)
    opened = h.open_db(str(db))
    try:
        before = opened.conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
        removed = h.prune(opened.conn, jumped - 30 * 86400)  # what record computes
        after = opened.conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
    finally:
        opened.conn.close()
    assert before == 3 and removed == 0 and after == 3


def test_invalid_utf8_in_the_history_does_not_stop_later_runs(node, tmp_path):
    db = tmp_path / "h.db"
    _record(db)
    conn = sqlite3.connect(str(db))
    conn.execute("UPDATE runs SET model = CAST(X'FFFE41' AS TEXT)")
    conn.commit()
    conn.close()
    code, out, err = _record(db)
    assert code == 0, err
    assert run_cli(["history", "--db", str(db), "--json"])[0] == 0


def test_a_read_only_history_is_one_clear_line(node, tmp_path):
    db = tmp_path / "h.db"
    _record(db)
    os.chmod(str(db), 0o444)
    if os.geteuid() == 0:
        pytest.skip("root writes read-only files")
    code, out, err = _record(db)
    assert code == 2 and "cannot write the history" in err and "Traceback" not in err


def test_a_killed_writers_temporary_is_removed_and_nothing_else(node, tmp_path):
    """Ours by exact name and header, and old enough: removed. A file in prometheus-client's PATH.<pid>.<n>
    shape (another program's), a temporary without our header, and a fresh one (a run still writing) stay."""
    from kvforensics.reports.textfile import HEADER, STALE_TEMP_S, TEMP_MARK

    prom = tmp_path / "k.prom"
    old = time.time() - STALE_TEMP_S - 60
    ours = tmp_path / ("k.prom" + TEMP_MARK + "0123456789abcdef")
    ours.write_text(HEADER + "\nkvforensics_up 1\n")
    theirs = tmp_path / "k.prom.999999999.1"  # a PID that is not running: still not ours to delete
    theirs.write_text("half")
    headless = tmp_path / ("k.prom" + TEMP_MARK + "fedcba9876543210")
    headless.write_text("kvforensics_up 1\n")
    fresh = tmp_path / ("k.prom" + TEMP_MARK + "00000000000000aa")
    fresh.write_text(HEADER + "\n")
    for p in (ours, theirs, headless):
        os.utime(str(p), (old, old))
    _record(tmp_path / "h.db", prom)
    assert prom.read_text().startswith(HEADER) and not ours.exists()
    assert theirs.read_text() == "half" and headless.exists() and fresh.exists()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")
def test_watch_in_a_real_terminal_redraws_and_leaves_on_ctrl_c(node, tmp_path):
    """As a person would: watch in tmux at 80 columns, two redraws, Ctrl-C, the shell prompt back."""
    sock = str(tmp_path / "tmux.sock")
    env = dict(node.env(), PYTHONPATH=str(ROOT), COLUMNS="80")
    done_flag = tmp_path / "done"
    command = "{} -m kvforensics watch --interval 0.3 --no-http --nvml-lib {}; echo rc=$? > {}".format(
        sys.executable, FAKE_LIB, done_flag)
    subprocess.run(["tmux", "-S", sock, "new-session", "-d", "-x", "80", "-y", "30", command], env=env, check=True)
    try:
        screens = []
        deadline = time.time() + 30
        while time.time() < deadline and len({s for s in screens if "kvforensics watch" in s}) < 2:
            time.sleep(0.4)
            screens.append(subprocess.run(["tmux", "-S", sock, "capture-pane", "-p"], capture_output=True,
                                          text=True).stdout)
        assert any("kvforensics watch" in s and "TP0" in s for s in screens), screens[-1:]
        assert all(len(line) <= 80 for s in screens for line in s.splitlines())
        subprocess.run(["tmux", "-S", sock, "send-keys", "C-c"], check=True)
        deadline = time.time() + 20
        while time.time() < deadline and not done_flag.exists():
            time.sleep(0.2)
        assert done_flag.read_text().strip() in ("rc=0", "rc=130")
    finally:
        subprocess.run(["tmux", "-S", sock, "kill-server"], capture_output=True)


def _tmux_screens(tmp_path, env, command, rows, until, timeout=30.0):
    """Run ``command`` in a detached tmux of 80 columns × ``rows`` and capture the pane until
    ``until(screens)``; then Ctrl-C. Returns the screens and the command's exit line ('rc=…')."""
    sock = str(tmp_path / "tmux.sock")
    done_flag = tmp_path / "done"
    subprocess.run(["tmux", "-S", sock, "new-session", "-d", "-x", "80", "-y", str(rows),
                    "{}; echo rc=$? > {}".format(command, done_flag)], env=env, check=True)
    try:
        screens: list = []
        deadline = time.time() + timeout
        while time.time() < deadline and not until(screens):
            time.sleep(0.4)
            screens.append(subprocess.run(["tmux", "-S", sock, "capture-pane", "-p"], capture_output=True,
                                          text=True).stdout)
        subprocess.run(["tmux", "-S", sock, "send-keys", "C-c"], check=True)
        deadline = time.time() + 20
        while time.time() < deadline and not done_flag.exists():
            time.sleep(0.2)
        return screens, done_flag.read_text().strip() if done_flag.exists() else ""
    finally:
        subprocess.run(["tmux", "-S", sock, "kill-server"], capture_output=True)


WATCH_METRICS = ("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 7.0\n"
                 "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 3.0\n"
                 "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.82\n")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")
def test_watch_shows_the_engines_load_and_every_gpu_on_one_scale(tmp_path):
    """On an 80 × 40 terminal, as a person reads it: the engine's running and waiting requests and
    its KV-cache usage (its /metrics) at the top, in view; and the sparklines on one scale, so the GPU
    with 2 GiB less free memory (a process beside the engine) draws lower, not the same height."""
    from tests.fakenode import FakeVllmNode

    build_fake_nvml()
    with FakeVllmNode(tmp_path / "node", tp=2, foreign={1: 2 * GIB}, metrics_text=WATCH_METRICS) as n:
        env = dict(n.env(), PYTHONPATH=str(ROOT), COLUMNS="80")
        command = "{} -m kvforensics watch --interval 0.3 --nvml-lib {}".format(sys.executable, FAKE_LIB)

        def seen(screens):
            return len([s for s in screens if "looks" in s and re.search(r"Worker_TP1 .* [▁-█]{3}", s)]) >= 2

        screens, rc = _tmux_screens(tmp_path, env, command, 40, seen)
    assert rc in ("rc=0", "rc=130"), screens[-1:]
    screen = [s for s in screens if "looks" in s][-1]
    lines = screen.splitlines()
    assert all(len(line) <= 80 for s in screens for line in s.splitlines())
    load = next(i for i, x in enumerate(lines) if "running" in x)
    assert load <= 2 and "vLLM" in lines[load], screen  # in view: right under the title
    assert "7 running · 3 waiting · KV cache 82% in use" in lines[load], screen
    rows = {x.split()[1]: x for x in lines if re.match(r"^\s+\d+\s+Worker_TP", x)}
    spark0, spark1 = (re.search(r"([▁-█]+)\s*$", rows[r]).group(1) for r in ("Worker_TP0", "Worker_TP1"))
    assert set(spark0) == {"█"} and set(spark1) < set("▁▂▃▄▅▆▇"), (spark0, spark1)
    assert "15.50" in rows["Worker_TP1"] and "17.50" in rows["Worker_TP0"]
    assert "15.50–17.50 GiB" in screen  # the one scale, said


def _on_a_small_disk(node, tmp_path, size: str, script: str):
    """Run ``script`` (sh) with a real tmpfs of ``size`` mounted at DISK in a private mount
    namespace: a real full or read-only filesystem, gone when the command ends. $KVF runs record."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare for a private mount namespace")
    disk = tmp_path / "disk"
    disk.mkdir()
    flags = ["-m"] if os.geteuid() == 0 else ["-Urm"]
    kvf = "{} -m kvforensics record --nvml-lib {} --no-http".format(sys.executable, FAKE_LIB)
    env = dict(node.env(), PYTHONPATH=str(ROOT), DISK=str(disk), KVF=kvf)
    body = 'mount -t tmpfs -o size={} none "$DISK" || exit 99\n{}'.format(size, script)
    done = subprocess.run(["unshare"] + flags + ["sh", "-c", body], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=120, universal_newlines=True)
    if done.returncode == 99 or "unshare failed" in done.stderr:
        pytest.skip("cannot mount a tmpfs here: " + done.stderr.strip()[:200])
    return done


def _fill(path: str) -> str:
    return 'head -c 8388608 /dev/zero > "{}" 2>/dev/null; '.format(path)


def test_a_full_disk_under_a_new_history_is_one_clear_line(node, tmp_path):
    done = _on_a_small_disk(node, tmp_path, "64k", _fill("$DISK/filler") + '$KVF --db "$DISK/h.db"')
    assert done.returncode == 2, done.stderr
    assert "cannot write the history: database or disk is full" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_a_disk_that_fills_under_an_existing_history_is_one_clear_line(node, tmp_path):
    script = ('$KVF --db "$DISK/h.db" >/dev/null 2>&1 || exit 98\n' + _fill("$DISK/filler")
              + '$KVF --db "$DISK/h.db"; code=$?; rm -f "$DISK/filler"; $KVF --db "$DISK/h.db" >/dev/null 2>&1 '
              '|| exit 97; exit $code')
    done = _on_a_small_disk(node, tmp_path, "1m", script)
    assert done.returncode == 2, done.stderr  # not 97/98: before and after, the history works
    assert "cannot write the history" in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_a_read_only_filesystem_under_the_history_is_one_clear_line(node, tmp_path):
    """Even for root, who writes a read-only file: a read-only mount stops every writer."""
    script = ('$KVF --db "$DISK/h.db" >/dev/null 2>&1 || exit 98\n'
              'mount -o remount,ro "$DISK" || exit 99\n$KVF --db "$DISK/h.db"')
    done = _on_a_small_disk(node, tmp_path, "1m", script)
    assert done.returncode == 2, done.stderr
    assert "Read-only file system" in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_a_full_disk_under_the_textfile_is_one_clear_line(node, tmp_path):
    script = ('$KVF --db "$PWD_DB" --prom-file "$DISK/k.prom" >/dev/null 2>&1 || exit 98\n'
              + _fill("$DISK/filler") + '$KVF --db "$PWD_DB" --prom-file "$DISK/k.prom"; code=$?; '
              'ls "$DISK"; exit $code')
    # The history lives off the small disk: only the textfile meets ENOSPC.
    done = _on_a_small_disk(node, tmp_path, "64k", script.replace("$PWD_DB", str(tmp_path / "h.db")))
    assert done.returncode == 2 and "k.prom: No space left on device" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert set(done.stdout.split()) <= {"k.prom", "filler"}  # no temp file left on the full disk
