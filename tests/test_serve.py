"""``kvforensics serve`` against the fake node: a real server process on a socket this test bound (passed
the way systemd's socket activation passes it), scraped over HTTP with urllib, compared with the textfile
``record`` writes for the same node, checked by promtool; caching, health, a shared history, SIGTERM."""

from __future__ import annotations

import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Dict, List, Tuple

import pytest

from kvforensics.agent.history import serve as serving
from kvforensics.agent.history import store as history
from tests.conftest import ROOT, run_cli
from tests.fakenode import FAKE_LIB, FakeNode, build_fake_nvml

# Hands the test's listening socket to `python -m kvforensics serve` as fd 3 with LISTEN_FDS/LISTEN_PID, as
# systemd does for a .socket unit: the port is this test's from bind to exit, no window to lose it in.
ACTIVATE = ("import os, sys; os.dup2(int(sys.argv[1]), 3); "
            "os.environ.update(LISTEN_FDS='1', LISTEN_PID=str(os.getpid())); "
            "os.execv(sys.executable, [sys.executable] + sys.argv[2:])")
# Values that differ between two looks at the same node by their nature: when, how long it took, and this
# real machine's MemAvailable (the fake node's GPUs are fixed, its host memory is the test machine's).
VOLATILE = ("kvforensics_last_success_timestamp_seconds", "kvforensics_collector_duration_seconds",
            "kvforensics_host_memory_available_bytes")


@pytest.fixture
def node(tmp_path, monkeypatch):
    """The fake node, its server on a port this test holds bound: another copy of the suite running its own
    fake servers (which record and serve see in /proc too) never shares its engine label."""
    build_fake_nvml()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        with FakeNode(tmp_path / "node", extra_flags=["--port", str(held.getsockname()[1])]) as n:
            monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
            n.port = held.getsockname()[1]
            yield n


class Served:
    def __init__(self, proc: subprocess.Popen, url: str) -> None:
        self.proc, self.url = proc, url

    def get(self, path: str) -> Tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def stop(self) -> Tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return self.proc.returncode, err


def start_serve(env: Dict[str, str], *args: str) -> Served:
    """`kvforensics serve ARGS` on a loopback socket this process bound and hands over (LISTEN_FDS)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    argv = [sys.executable, "-c", ACTIVATE, str(listener.fileno()), "-m", "kvforensics", "serve"] + list(args)
    proc = subprocess.Popen(argv, env=dict(env, PYTHONPATH=str(ROOT)), cwd=str(ROOT), pass_fds=(listener.fileno(),),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    served = Served(proc, "http://127.0.0.1:{}".format(listener.getsockname()[1]))
    listener.close()  # the server holds its copy
    return served


@pytest.fixture
def serve(node, tmp_path):
    """Start `kvforensics serve` on a socket this test bound; stopped (SIGTERM) at the end."""
    started: List[Served] = []

    def start(db, *extra: str) -> Served:
        served = start_serve(node.env(), "--db", str(db), "--nvml-lib", str(FAKE_LIB), "--no-http", *extra)
        started.append(served)
        return served

    yield start
    for s in started:
        s.stop()


def _series(text: str) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _families(text: str) -> Dict[str, Tuple[str, str]]:
    from prometheus_client.parser import text_string_to_metric_families

    return {fam.name: (fam.type, fam.documentation) for fam in text_string_to_metric_families(text)}


def _samples(db) -> int:
    conn = sqlite3.connect(str(db))
    try:
        return conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
    finally:
        conn.close()


def _value(text: str, name: str) -> float:
    return next(v for (n, _), v in _series(text).items() if n == name)


def test_a_scrape_is_the_textfile_record_writes_for_the_same_node(serve, node, tmp_path):
    prom = tmp_path / "kvforensics.prom"
    # this node's engine only: another copy's fake servers may come and go in /proc between the two looks
    only = ["--engine", str(node.port), "--node-series"]
    code, out, err = run_cli(["record", "--db", str(tmp_path / "record.db"), "--prom-file", str(prom),
                              "--nvml-lib", str(FAKE_LIB), "--no-http", "--quiet"] + only)
    assert code == 0, err
    status, scraped = serve(tmp_path / "serve.db", *only).get("/metrics")
    assert status == 200, scraped
    textfile = prom.read_text()
    assert _families(scraped) == _families(textfile)  # same names, types and help; nothing more (no process_*)
    # other_engines counts whatever else serves on this machine now (another copy of the suite's nodes)
    ours, theirs = ({k: v for k, v in _series(text).items() if ("code", "other_engines") not in k[1]}
                    for text in (scraped, textfile))
    assert sorted(ours) == sorted(theirs)  # the same series, label for label
    assert len(ours) > 60  # 8 GPUs' memory, low-water marks, engine, findings, collectors, host
    for key, value in ours.items():
        if key[0] not in VOLATILE:
            assert value == theirs[key], key
    assert abs(_value(scraped, "kvforensics_last_success_timestamp_seconds") - time.time()) < 600


@pytest.mark.skipif(subprocess.run(["sh", "-c", "command -v promtool"], capture_output=True).returncode != 0,
                    reason="promtool not installed (CI installs prometheus)")
def test_promtool_finds_nothing_to_say_about_a_scrape(serve, tmp_path):
    status, scraped = serve(tmp_path / "h.db").get("/metrics")
    assert status == 200
    done = subprocess.run(["promtool", "check", "metrics"], input=scraped, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr


def test_scrapes_within_the_min_interval_share_one_sample(serve, tmp_path):
    db = tmp_path / "h.db"
    s = serve(db, "--min-interval", "1h")
    first = s.get("/metrics")[1]
    second = s.get("/metrics")[1]
    assert first == second  # the cached registry, as it was
    assert _value(second, "kvforensics_engine_run_samples") == 1
    assert _samples(db) == 1
    # eight scrapes at once on a fresh server: one sample, whichever scrape took it
    db2 = tmp_path / "h2.db"
    s2 = serve(db2, "--min-interval", "1h")
    results: List[int] = []
    threads = [threading.Thread(target=lambda: results.append(s2.get("/metrics")[0])) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 8 and _samples(db2) == 1


def test_with_no_min_interval_every_scrape_is_a_sample_in_the_history(serve, tmp_path):
    db = tmp_path / "h.db"
    s = serve(db, "--min-interval", "0")
    for n in (1, 2, 3):
        assert _value(s.get("/metrics")[1], "kvforensics_engine_run_samples") == n
    assert _samples(db) == 3
    code, out, err = run_cli(["history", "--db", str(db), "--json"])
    assert code == 0 and '"samples": 3' in out


def test_serve_and_a_cron_record_share_the_history_and_its_lock(serve, tmp_path):
    """A record between two scrapes writes into the same engine run; a lock held elsewhere makes serve
    skip its sample and answer from the last one, never wait and never write beside it."""
    db = tmp_path / "h.db"
    s = serve(db, "--min-interval", "0")
    assert _value(s.get("/metrics")[1], "kvforensics_engine_run_samples") == 1
    code, out, err = run_cli(["record", "--db", str(db), "--nvml-lib", str(FAKE_LIB), "--no-http", "--quiet"])
    assert code == 0, err
    before = s.get("/metrics")[1]
    assert _value(before, "kvforensics_engine_run_samples") == 3  # serve, record, serve: one run
    with history.Lock(str(db)):  # what a running `record` holds
        status, during = s.get("/metrics")
        health, why = s.get("/healthz")
    assert status == 200 and during == before and _samples(db) == 3
    assert health == 200 and "locked by another kvforensics" in why  # the last good sample is recent
    assert _value(s.get("/metrics")[1], "kvforensics_engine_run_samples") == 4
    code, err = s.stop()
    assert code == 0
    assert "skipped a sample, serving the last one: the history {} is locked by another kvforensics".format(db) in err


def test_healthz_is_503_until_a_sample_succeeds(serve, tmp_path):
    db = tmp_path / "h.db"
    with history.Lock(str(db)):
        s = serve(db, "--min-interval", "0")
        status, body = s.get("/metrics")
        assert status == 503
        assert body.startswith("no sample yet: no successful sample yet (skipped a sample: the history")
        status, body = s.get("/healthz")
        assert status == 503 and body.startswith("unhealthy: no successful sample yet")
    status, body = s.get("/healthz")
    assert status == 200 and body.startswith("ok: last successful sample")
    assert s.get("/nothing")[0] == 404


def test_sigterm_stops_it_cleanly(serve, tmp_path):
    db = tmp_path / "h.db"
    s = serve(db)
    assert s.get("/metrics")[0] == 200
    code, err = s.stop()
    assert code == 0
    assert err.splitlines()[0].startswith("kvforensics serve: listening on http://127.0.0.1:")
    assert err.splitlines()[-1] == "kvforensics serve: stopped"
    conn = sqlite3.connect(str(db))
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    with pytest.raises(OSError):  # nobody listens any more
        urllib.request.urlopen(s.url + "/healthz", timeout=10)


def test_listen_binds_what_it_is_told_and_says_where(node, tmp_path):
    """--listen ADDR:0 takes a free port of the server's own and names it on stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "kvforensics", "serve", "--listen", "127.0.0.1:0", "--db",
                             str(tmp_path / "h.db"), "--nvml-lib", str(FAKE_LIB), "--no-http"],
                            env=dict(node.env(), PYTHONPATH=str(ROOT)), cwd=str(ROOT), stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stderr.readline()
        url = line.split("listening on ", 1)[1].split(" ", 1)[0]
        with urllib.request.urlopen(url + "/healthz", timeout=60) as r:
            assert r.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


@pytest.mark.parametrize("argv,message", [
    (["--listen", ":9842"], "name the address: 127.0.0.1:9842 for this host only, 0.0.0.0:9842"),
    (["--listen", "127.0.0.1:65536"], "the port must be 0–65535"),
    (["--listen", "localhost"], "--listen takes ADDR:PORT"),
    (["--min-interval", "-5"], "--min-interval must be 0–86400 seconds"),
    (["--min-interval", "soon"], "--min-interval: durations look like"),
    (["--keep", "ever"], "--keep: durations look like"),
])
def test_usage_errors_exit_2_with_one_line(argv, message, tmp_path):
    code, out, err = run_cli(["serve", "--db", str(tmp_path / "h.db")] + argv)
    assert code == 2 and message in err and len(err.splitlines()) == 1, err


def test_an_address_in_use_is_a_usage_error(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        code, out, err = run_cli(["serve", "--db", str(tmp_path / "h.db"), "--listen",
                                  "127.0.0.1:{}".format(taken.getsockname()[1])])
    finally:
        taken.close()
    assert code == 2 and "Address already in use" in err


@pytest.mark.parametrize("text,expected", [
    ("9842", ("127.0.0.1", 9842)), ("0.0.0.0:9842", ("0.0.0.0", 9842)), ("[::1]:9842", ("::1", 9842)),
    ("[::]:1", ("::", 1)), ("node-1.example:80", ("node-1.example", 80)),
])
def test_listen_addresses(text, expected):
    from kvforensics.agent.cli.serve_http import parse_listen

    assert parse_listen(text) == expected


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_health_window_and_one_line_per_change_of_state():
    """The sampler alone, on a clock the test moves: /healthz's rule, and a failing look logged once."""
    clock, lines, outcomes = Clock(), [], ["ok", "fail", "fail", "ok"]

    def take():
        if outcomes.pop(0) == "fail":
            raise history.HistoryError("disk full")
        return serving.Look("registry", True)

    sampler = serving.Sampler(take, 15.0, log=lines.append, clock=clock)
    window = serving.health_window(15.0)
    assert window == 45.0 and serving.health_window(0) == serving.HEALTH_FLOOR_S
    assert sampler.current() == "registry" and sampler.health(window).healthy
    clock.now += 14.9
    sampler.current()  # within the interval: no look
    assert sampler.looks == 1
    clock.now += 0.1
    assert sampler.current() == "registry"  # the look failed: the last payload is served
    clock.now += 15
    sampler.current()
    assert sampler.health(window).healthy  # 30 s since the last good look
    clock.now += 15.1
    health = sampler.health(window)
    assert not health.healthy and health.message == "last successful sample 45 s ago, more than 45 s (sample " \
                                                    "failed: disk full)"
    sampler.current()
    assert sampler.health(window).healthy
    assert lines == ["kvforensics serve: sample failed: disk full", "kvforensics serve: sampling again"]
    sampler.close()
    clock.now += 3600
    sampler.current()
    assert sampler.looks == 2  # closed: no look after shutdown began
