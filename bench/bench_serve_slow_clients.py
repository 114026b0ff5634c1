"""``kvforensics serve`` against node_exporter under the same hostile clients, side by side on loopback.

For each server: N slow clients (each sends half a request line, then nothing), then while they hold their
sockets, 20 scrapes of /metrics one after another: how many answered, the median and worst latency, the
server's threads and RSS; and the time for 200 plain connects (the listen backlog). The fake NVML node
stands in for GPUs (tests/fakenode.py); node_exporter is Debian's prometheus-node-exporter. Results are
appended to bench/RESULTS.md.
"""

from __future__ import annotations

import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import append  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = (0, 300, 2000)
SCRAPES = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(url: str) -> None:
    for _ in range(600):
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("{} never answered".format(url))


def _status(pid: int) -> Tuple[int, int]:
    text = Path("/proc/{}/status".format(pid)).read_text()
    return (int(re.search(r"Threads:\s+(\d+)", text).group(1)), int(re.search(r"VmRSS:\s+(\d+)", text).group(1)))


def _measure(url: str, pid: int, clients: int) -> Dict[str, float]:
    host, port = "127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0])
    slow = []
    for _ in range(clients):
        s = socket.create_connection((host, port), timeout=30)
        s.sendall(b"GET /metr")
        slow.append(s)
    times: List[float] = []
    ok = 0
    for _ in range(SCRAPES):
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=15) as r:
                r.read()
                ok += r.status == 200
        except OSError:
            pass
        times.append(time.perf_counter() - start)
    threads, rss = _status(pid)
    for s in slow:
        s.close()
    start = time.perf_counter()
    for s in [socket.create_connection((host, port), timeout=30) for _ in range(200)]:
        s.close()
    connects = time.perf_counter() - start
    return {"ok": ok, "median_ms": statistics.median(times) * 1000, "worst_ms": max(times) * 1000,
            "threads": threads, "rss_mib": rss / 1024, "connects_s": connects}


def main() -> None:
    from tests.fakenode import FAKE_LIB, FakeNode, build_fake_nvml

    build_fake_nvml()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, FakeNode(Path(tmp) / "node") as node:
        env = dict(node.env(), PYTHONPATH=str(ROOT))
        port = _free_port()
        serve = subprocess.Popen([sys.executable, "-m", "kvforensics", "serve", "--listen", "127.0.0.1:{}".format(port),
                                  "--db", str(Path(tmp) / "h.db"), "--nvml-lib", str(FAKE_LIB), "--no-http"],
                                 env=env, cwd=str(ROOT), stderr=subprocess.DEVNULL)
        servers = [("kvforensics serve", "http://127.0.0.1:{}/metrics".format(port), serve)]
        exporter = shutil.which("prometheus-node-exporter")
        if exporter:
            eport = _free_port()
            ne = subprocess.Popen([exporter, "--web.listen-address=127.0.0.1:{}".format(eport),
                                   "--collector.textfile.directory={}".format(tmp)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            servers.append(("node_exporter", "http://127.0.0.1:{}/metrics".format(eport), ne))
        try:
            for name, url, proc in servers:
                _wait_up(url)
                for clients in CLIENTS:
                    m = _measure(url, proc.pid, clients)
                    rows.append("| {} | {:,} | {}/{} | {:.1f} | {:.1f} | {} | {:.0f} | {:.3f} |".format(
                        name, clients, m["ok"], SCRAPES, m["median_ms"], m["worst_ms"], m["threads"], m["rss_mib"],
                        m["connects_s"]))
        finally:
            for _, _, proc in servers:
                proc.terminate()
                proc.wait(timeout=60)
    append("serve under slow clients, beside node_exporter", [
        "Each row: N clients that sent half a request line and hold their sockets, then {} scrapes of /metrics "
        "one after another (answered, median and worst ms), the server's threads and RSS while they hold, and "
        "200 plain connects after they left (s).".format(SCRAPES), "",
        "| server | slow clients | /metrics answered | median ms | worst ms | threads | RSS MiB | 200 connects s |",
        "|---|---|---|---|---|---|---|---|"] + rows)


if __name__ == "__main__":
    main()
