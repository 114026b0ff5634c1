"""``kvforensics serve`` against hostile clients and a stuck collector, over real loopback sockets: threads stay
bounded under 300 slow clients while /metrics answers; headers past the limit cost nothing kept; the backlog is
node_exporter's; odd Accept headers and clients gone early get no traceback; a sample that never ends blocks
neither /metrics nor /healthz, and SIGTERM still stops the server. Hang guards only, no timing assertions."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.fakenode import FAKE_LIB
from tests.test_serve import node, serve, start_serve  # noqa: F401  (fixtures)

GUARD_S = 120


def _threads(pid: int) -> int:
    return len(os.listdir("/proc/{}/task".format(pid)))


def _host_port(url: str):
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    return host, int(port)


def _slow_clients(url: str, count: int):
    """``count`` connections that each send half a request line and then nothing."""
    socks = []
    for _ in range(count):
        s = socket.create_connection(_host_port(url), timeout=GUARD_S)
        s.sendall(b"GET /metr")
        socks.append(s)
    return socks


def test_300_slow_clients_take_no_thread_each_and_metrics_still_answers(serve, tmp_path):  # noqa: F811
    served = serve(tmp_path / "h.db")
    assert served.get("/metrics")[0] == 200
    before = _threads(served.proc.pid)
    socks = _slow_clients(served.url, 300)
    try:
        code, body = served.get("/metrics")
        assert code == 200 and "kvforensics_gpu_memory_free_bytes" in body
        assert served.get("/healthz")[0] == 200
        assert _threads(served.proc.pid) <= before + 2, (before, _threads(served.proc.pid))
    finally:
        for s in socks:
            s.close()
    code, err = served.stop()
    assert code == 0 and "Traceback" not in err, err


def test_headers_past_the_limit_close_the_connection_and_keep_nothing(serve, tmp_path):  # noqa: F811
    served = serve(tmp_path / "h.db")
    with socket.create_connection(_host_port(served.url), timeout=GUARD_S) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        try:
            for _ in range(200):  # 6.4 MB of headers, far past the 64 KiB limit
                s.sendall(b"X-Junk: " + b"a" * 32000 + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed it: what a limit does
        s.settimeout(GUARD_S)
        try:
            assert s.recv(1 << 16) == b""
        except ConnectionResetError:
            pass
    assert served.get("/metrics")[0] == 200
    rss = int(re.search(r"VmRSS:\s+(\d+) kB", open("/proc/{}/status".format(served.proc.pid)).read()).group(1))
    assert rss < 200 << 10, rss  # KiB: nothing of the 6.4 MB kept
    code, err = served.stop()
    assert code == 0 and "Traceback" not in err, err


@pytest.mark.parametrize("accept", ["application/openmetrics-text; version=x", "application/openmetrics-text; "
                                    "version=9.9.9; charset=utf-8", "*/*;q=nonsense", "\x00\xff"])
def test_odd_accept_headers_are_answered_without_a_traceback(serve, tmp_path, accept):  # noqa: F811
    served = serve(tmp_path / "h.db")
    with socket.create_connection(_host_port(served.url), timeout=GUARD_S) as s:
        s.sendall("GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {}\r\n\r\n".format(accept).encode("latin-1"))
        s.settimeout(GUARD_S)
        head = s.recv(1 << 16).split(b"\r\n", 1)[0]
    assert re.match(rb"HTTP/1\.1 (200|406) ", head), head
    code, err = served.stop()
    assert code == 0 and "Traceback" not in err, err


def test_a_client_gone_early_is_dropped_quietly(serve, tmp_path):  # noqa: F811
    served = serve(tmp_path / "h.db")
    for _ in range(20):
        s = socket.create_connection(_host_port(served.url), timeout=GUARD_S)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()  # a reset before the answer
    assert served.get("/metrics")[0] == 200
    code, err = served.stop()
    assert code == 0 and "Traceback" not in err and "Exception" not in err, err


@pytest.mark.skipif(shutil.which("ss") is None, reason="ss (iproute2) not installed")
def test_the_listen_backlog_is_node_exporters(node, tmp_path):  # noqa: F811
    proc = subprocess.Popen([sys.executable, "-m", "kvforensics", "serve", "--listen", "127.0.0.1:0", "--db",
                             str(tmp_path / "h.db"), "--nvml-lib", str(FAKE_LIB), "--no-http"],
                            env=dict(node.env(), PYTHONPATH=str(ROOT)), cwd=str(ROOT), stderr=subprocess.PIPE,
                            text=True)
    try:
        url = proc.stderr.readline().split("listening on ", 1)[1].split(" ", 1)[0]
        port = _host_port(url)[1]
        out = subprocess.run(["ss", "-ltnH", "sport = :{}".format(port)], capture_output=True, text=True).stdout
        backlog = int(out.split()[2])  # Send-Q of a listening socket: its backlog
        assert backlog >= 128, out
        socks = [socket.create_connection(("127.0.0.1", port), timeout=GUARD_S) for _ in range(200)]
        for s in socks:
            s.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 0 and "Traceback" not in err, err


def test_a_sample_that_never_ends_blocks_neither_endpoint_and_sigterm_stops_it(node, tmp_path):  # noqa: F811
    """--log names a FIFO whose writer wrote a line and then holds it open: the first look never ends."""
    from kvforensics.agent.history.serve import LATE_S

    fifo = tmp_path / "engine.log"
    os.mkfifo(str(fifo))
    writer = subprocess.Popen([sys.executable, "-c", "import sys, time\nf = open(sys.argv[1], 'w')\n"
                               "f.write('[2026-05-01 10:00:00] starting\\n'); f.flush(); time.sleep(300)", str(fifo)])
    try:
        served = start_serve(node.env(), "--db", str(tmp_path / "h.db"), "--nvml-lib", str(FAKE_LIB), "--no-http",
                             "--log", str(fifo))
        try:
            code, body = served.get("/metrics")  # waits for the stuck look a few seconds, then answers
            assert code == 503 and body.startswith("no sample yet"), body
            time.sleep(LATE_S + 1)
            code, body = served.get("/healthz")
            assert code == 503 and "the sample is late: a look began" in body, body
        finally:
            code, err = served.stop()
        assert code == 0 and "Traceback" not in err, err
    finally:
        writer.kill()
        writer.wait()
