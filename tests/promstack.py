"""A real Prometheus and a real node_exporter (Debian's packages: `apt-get install prometheus
prometheus-node-exporter`) for the tests, on loopback ports they bind themselves (port 0: each says in its
log which port it got, so no port is chosen here and none can be lost to another process), with their data
in the test's own folder. Stopped (and waited for) when the ``with`` block ends."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

PROMETHEUS = "prometheus"
NODE_EXPORTER = "prometheus-node-exporter"  # Debian's name for node_exporter
LISTENING = re.compile(r'msg="?Listening on"? address=\[?([0-9.:a-f]+?)\]?:(\d+)')
START_TIMEOUT_S = 120.0


def missing() -> Optional[str]:
    """Why the stack cannot run here, or None."""
    for tool in (PROMETHEUS, NODE_EXPORTER):
        if shutil.which(tool) is None:
            return "{} not installed (CI installs prometheus and prometheus-node-exporter)".format(tool)
    return None


class Started:
    def __init__(self, proc: subprocess.Popen, log: Path, port: int) -> None:
        self.proc, self.log, self.port = proc, log, port
        self.url = "http://127.0.0.1:{}".format(port)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start(argv: Sequence[str], log: Path) -> Started:
    """Start a Go exporter or server that binds 127.0.0.1:0 itself; its port from its own log line."""
    out = open(str(log), "wb")
    proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    out.close()
    deadline = time.time() + START_TIMEOUT_S
    while time.time() < deadline:
        found = LISTENING.search(log.read_text(errors="replace"))
        if found:
            return Started(proc, log, int(found.group(2)))
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise RuntimeError("{} did not start: {}".format(argv[0], log.read_text(errors="replace")[-2000:]))


def get(url: str, timeout: float = 30.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class Stack:
    """``with Stack(workdir) as s``: ``s.node_exporter(textfile_dir)``, ``s.prometheus(targets, rules)``,
    ``s.query(expr)``, ``s.wait_for(expr)``."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.started: List[Started] = []
        self.prom: Optional[Started] = None

    def __enter__(self) -> "Stack":
        return self

    def __exit__(self, *exc: object) -> None:
        for s in reversed(self.started):
            s.stop()

    def node_exporter(self, textfile_dir: Path) -> Started:
        """node_exporter with only its textfile collector (the others read this machine, not the test's)."""
        s = start([NODE_EXPORTER, "--web.listen-address=127.0.0.1:0", "--collector.disable-defaults",
                   "--collector.textfile", "--collector.textfile.directory={}".format(textfile_dir)],
                  self.dir / "node_exporter.log")
        self.started.append(s)
        return s

    def prometheus(self, jobs: Dict[str, str], rules: Sequence[Path] = ()) -> Started:
        """Prometheus scraping each job's target (host:port) every 2 s (a scrape may wait that long for a sample on
        a busy machine), evaluating ``rules`` every second."""
        config = {"global": {"scrape_interval": "2s", "evaluation_interval": "1s", "scrape_timeout": "2s"},
                  "rule_files": [str(r) for r in rules],
                  "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]}
                                     for job, target in jobs.items()]}
        path = self.dir / "prometheus.yml"
        path.write_text(json.dumps(config))  # JSON is YAML
        s = start([PROMETHEUS, "--config.file={}".format(path), "--storage.tsdb.path={}".format(self.dir / "tsdb"),
                   "--web.listen-address=127.0.0.1:0"], self.dir / "prometheus.log")
        self.started.append(s)
        self.prom = s
        return s

    def query(self, expr: str) -> List[Dict[str, Any]]:
        assert self.prom is not None
        doc = json.loads(get("{}/api/v1/query?{}".format(self.prom.url, urllib.parse.urlencode({"query": expr}))))
        assert doc["status"] == "success", doc
        return doc["data"]["result"]

    def api(self, path: str) -> Any:
        assert self.prom is not None
        doc = json.loads(get(self.prom.url + path))
        assert doc["status"] == "success", doc
        return doc["data"]

    def wait_for(self, expr: str, timeout: float = 120.0, count: int = 1) -> List[Dict[str, Any]]:
        """The query's result once it has ``count`` series (scrapes take a few seconds to arrive), or what it
        has after ``timeout``."""
        deadline = time.time() + timeout
        while True:
            try:
                result = self.query(expr)
            except OSError:
                result = []
            if len(result) >= count or time.time() > deadline:
                return result
            time.sleep(0.5)
