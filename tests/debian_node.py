"""The inner half of tests/test_deploy.py's Debian test: run as PID 1 of a private PID and mount namespace
(``unshare --mount --pid --fork --mount-proc``), so that this /proc shows no other node_exporter and the
bind mount below is seen by nothing else. On a Debian or Ubuntu host with prometheus-node-exporter installed:

1. bind-mount a fresh folder on the package's textfile directory (the host's is never written);
2. `kvforensics deploy-files` with no --textfile-dir, before and after the packaged exporter starts (as its
   unit starts it: its /etc/default ARGS, only listening on a loopback port of its own choosing);
3. the cron line it wrote, verbatim but for a short run;
4. a scrape of the exporter.

Prints one JSON document. ``python -m tests.debian_node KVFORENSICS TEXTFILES WORK``."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

PACKAGED = "/var/lib/prometheus/node-exporter"


def _args() -> list:
    try:
        text = Path("/etc/default/prometheus-node-exporter").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith("ARGS="):
            return " ".join(shlex.split(line[5:])).split()
    return []


def main(kvforensics: str, textfiles: str, work: str) -> dict:
    from tests import promstack

    subprocess.run(["mount", "--bind", textfiles, PACKAGED], check=True)
    out = {}
    before = subprocess.run([kvforensics, "deploy-files", os.path.join(work, "before")], capture_output=True, text=True)
    out["before"] = before.stdout + before.stderr
    exporter = promstack.start(["prometheus-node-exporter"] + _args() + ["--web.listen-address=127.0.0.1:0"],
                               Path(work) / "node_exporter.log")
    try:
        after = subprocess.run([kvforensics, "deploy-files", os.path.join(work, "after")], capture_output=True,
                               text=True)
        out["after"], out["exporter_pid"] = after.stdout + after.stderr, exporter.proc.pid
        cron = Path(work, "after", "kvforensics.cron").read_text()
        line = next(x for x in cron.splitlines() if x and not x.startswith("#"))
        command = line.split(None, 6)[6].replace("--samples 6 --interval 20", "--samples 2 --interval 0")
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=300)
        out["cron"] = {"command": command, "code": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
        out["files"] = sorted(os.listdir(PACKAGED))
        out["scrape"] = promstack.get(exporter.url + "/metrics")
    finally:
        exporter.stop()
    return out


if __name__ == "__main__":
    sys.stdout.write(json.dumps(main(*sys.argv[1:4])))
