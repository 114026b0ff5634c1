"""Build the probe shipped to inspected hosts, and check what it answers.

The probe is one Python script sent on the SSH exec channel's stdin to a fixed command,
``python3 -I -`` (isolated mode: no user site, no cwd on sys.path). It carries a zip of
``collectors/`` plus nvidia-ml-py's ``pynvml.py``, imported from memory by a small finder, so
nothing is installed or written on the host. Options travel as base64 JSON inside the script:
data, never a command line. The zip is reproducible (sorted entries, fixed timestamps), so its
sha256 identifies the code that ran; the probe echoes it and a checksum of its snapshot.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from collectors.probe import MARKER, VERSION, canonical
from collectors.snapshot import SCHEMA as SNAPSHOT_SCHEMA

REMOTE_COMMAND = "python3 -I -"  # constant: nothing the user types ever reaches a remote shell
_PACKAGE = Path(__file__).resolve().parents[2] / "collectors"

_WRAPPER = '''\
import base64, hashlib, importlib.machinery, io, json, sys, zipfile
_BLOB = base64.b64decode({blob!r})
_OPTIONS = json.loads(base64.b64decode({options!r}).decode("utf-8"))
_SOURCES = {{}}
with zipfile.ZipFile(io.BytesIO(_BLOB)) as _zf:
    for _name in _zf.namelist():
        _SOURCES[_name] = _zf.read(_name)


class _FromMemory(object):
    """Finder and loader for the shipped modules (from the zip above; nothing touches the disk).

    Plain protocol methods, no importlib.abc: importing that costs the probe 15 ms per host."""

    def _key(self, name):
        rel = name.replace(".", "/")
        if rel + "/__init__.py" in _SOURCES:
            return rel + "/__init__.py"
        if rel + ".py" in _SOURCES:
            return rel + ".py"
        return None

    def find_spec(self, name, path=None, target=None):
        key = self._key(name)
        if key is None:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=key.endswith("__init__.py"))

    def create_module(self, spec):
        return None

    def plugin_folders(self, package):
        """The engine folders of a package (collectors/registry.py): those that hold a plugin.py."""
        prefix = package.replace(".", "/") + "/"
        return sorted(set(k[len(prefix):].split("/")[0] for k in _SOURCES
                          if k.startswith(prefix) and k.count("/") == prefix.count("/") + 1
                          and k.endswith("/plugin.py")))

    def exec_module(self, module):
        key = self._key(module.__name__)
        if key.endswith("__init__.py"):
            module.__path__ = []
        exec(compile(_SOURCES[key], "<kvforensics-probe>/" + key, "exec"), module.__dict__)


sys.dont_write_bytecode = True
sys.meta_path.insert(0, _FromMemory())
from collectors import probe as _probe
sys.exit(_probe.run(_OPTIONS, hashlib.sha256(_BLOB).hexdigest()))
'''


def _pynvml_source() -> Optional[bytes]:
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return None
    return Path(pynvml.__file__).read_bytes()


def code_zip() -> bytes:
    """collectors/**/*.py and pynvml.py, deterministic: same code, same bytes, same sha256."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        files = sorted(p.relative_to(_PACKAGE).as_posix() for p in _PACKAGE.rglob("*.py"))
        for rel in files:
            path = _PACKAGE / rel
            info = zipfile.ZipInfo("collectors/" + rel, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes())
        nvml = _pynvml_source()
        if nvml is not None:
            info = zipfile.ZipInfo("pynvml.py", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, nvml)
    return buf.getvalue()


@dataclass(frozen=True)
class Probe:
    script: bytes  # what goes on stdin
    code_sha256: str


def build(options: Dict[str, Any], blob: Optional[bytes] = None) -> Probe:
    blob = blob if blob is not None else code_zip()
    encoded_options = base64.b64encode(json.dumps(options).encode("utf-8")).decode("ascii")
    script = _WRAPPER.format(blob=base64.b64encode(blob).decode("ascii"), options=encoded_options)
    return Probe(script.encode("utf-8"), hashlib.sha256(blob).hexdigest())


class ProbeError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _last_marked_line(text: str) -> Optional[str]:
    """What follows the marker on the last line that begins with it; found in place, not by splitting
    every line (64 MiB of newlines would be a list of 64 million lines)."""
    end = len(text)
    while True:
        at = text.rfind(MARKER, 0, end)
        if at == -1:
            return None
        if at == 0 or text[at - 1] in "\n\r":
            stop = min((i for i in (text.find("\n", at), text.find("\r", at)) if i != -1), default=len(text))
            return text[at + len(MARKER):stop]
        end = at


def parse_answer(stdout: bytes, probe: Probe) -> Dict[str, Any]:
    """The snapshot from the probe's output; login-shell noise around the line is ignored."""
    line = _last_marked_line(stdout.decode("utf-8", "replace"))
    if line is None:
        raise ProbeError("probe.no_answer", "the probe printed no answer")
    from agent.model import evidence

    try:
        answer = evidence.loads(line)
    except evidence.EvidenceError as exc:
        raise ProbeError("probe.invalid_answer", "the probe's answer is unusable: {} (truncated output?)".format(
            exc)) from None
    if not isinstance(answer, dict) or answer.get("version") != VERSION:
        raise ProbeError("probe.version", "the probe answered protocol version {}, expected {}".format(
            answer.get("version") if isinstance(answer, dict) else "?", VERSION))
    if answer.get("code_sha256") != probe.code_sha256:
        raise ProbeError("probe.code_mismatch", "the probe ran different code than was sent")
    snap = answer.get("snapshot")
    if hashlib.sha256(canonical(snap).encode("ascii")).hexdigest() != answer.get("checksum"):
        raise ProbeError("probe.checksum", "the probe's snapshot failed its checksum")
    if not isinstance(snap, dict) or snap.get("schema") != SNAPSHOT_SCHEMA:
        raise ProbeError("probe.invalid_answer", "the probe's answer holds no kvforensics snapshot")
    try:  # the checksum proves transport, not honesty: a host can re-sign a forged snapshot
        evidence.check("snapshot", snap)
    except evidence.EvidenceError as exc:
        raise ProbeError("probe.invalid_answer", "the probe's snapshot breaks the snapshot schema at {}".format(
            exc)) from None
    return snap


def write(path: str, options: Optional[Dict[str, Any]] = None) -> Tuple[str, int]:
    """Write the exact probe script (for reading, or running by hand: python3 -I - < probe.py)."""
    probe = build(options or {})
    Path(path).write_bytes(probe.script)
    return probe.code_sha256, len(probe.script)
