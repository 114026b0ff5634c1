"""The probe's entry point on an inspected host: collect one snapshot, print one line.

Runs inside the wrapper built by ``agent/remote/probe.py`` (collectors and pynvml imported from
memory). Options arrive as data (base64 JSON inside the script read from stdin), never on a
command line. The answer is one line ``KVF-PROBE <json>`` on stdout, where the JSON holds the
protocol version, the sha256 of the code that ran, the snapshot, and the sha256 of the
snapshot's canonical JSON; everything else goes to stderr. Exit 0 whenever a snapshot was
printed, even one full of problems.
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Any, Dict

MARKER = "KVF-PROBE "
VERSION = 1
# How a host runs the probe: the script on stdin, to this fixed command; nothing the user types ever reaches a
# remote shell.
REMOTE_COMMAND = "python3 -I -"
ALLOWED = ("nvml_lib", "log", "startup", "model_config_path", "http", "engine")


def sha256_hex(data: bytes) -> str:
    """sha256 from the interpreter's own module where it has one (``_sha256``, 3.8–3.11; ``_sha2`` from 3.12):
    hashlib loads OpenSSL first, ~3 ms of every host's CPU for the two hashes the probe takes, and of the
    client's before its first ssh starts (the probe's cache index, the ssh client's cache, a master's name)."""
    try:
        from _sha256 import sha256  # type: ignore[import-not-found]
    except ImportError:
        try:
            sha256 = __import__("_sha2").sha256  # 3.12+: the same C code, renamed
        except (ImportError, AttributeError):
            from hashlib import sha256
    return sha256(data).hexdigest()  # type: ignore[no-any-return]


def canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def run(options: Dict[str, Any], code_sha256: str) -> int:
    limit = options.get("time_limit_s")
    if isinstance(limit, (int, float)) and 0 < limit < 86400 and hasattr(signal, "alarm"):
        # A probe that hangs (a stuck NVML call, an NFS log) ends itself: nothing is left running
        # on the inspected host after the client gave up on it.
        signal.alarm(int(limit) + 5)
    from kvforensics.collectors import snapshot  # here: the client imports this module for its constants alone

    kwargs = {k: v for k, v in options.items() if k in ALLOWED}
    snap = snapshot.collect(**kwargs)
    body = canonical(snap)
    answer = {"version": VERSION, "code_sha256": code_sha256, "snapshot": snap,
              "checksum": sha256_hex(body.encode("ascii"))}
    sys.stdout.write(MARKER + canonical(answer) + "\n")
    sys.stdout.flush()
    return 0
