"""Build the probe shipped to inspected hosts, and check what it answers.

The probe is one Python script sent on the SSH exec channel's stdin to a fixed command,
``python3 -I -`` (isolated mode: no user site, no cwd on sys.path). It carries a zip of
``collectors/`` plus nvidia-ml-py's ``pynvml.py``, imported from memory by a small finder, so
nothing is installed or written on the host. Options travel as base64 JSON inside the script:
data, never a command line. The zip is reproducible (sorted entries, fixed timestamps), so its
sha256 identifies the code that ran; the probe echoes it and a checksum of its snapshot.

On the wire (~75 KB of xz in ~93 KB of base85, from ~190 KB of deflated zip): the zip's entries are
stored, with comments and docstrings blanked (``slim``: every line stays where it was, so a
traceback still points at the source), and the whole zip is one xz stream, which compresses across
files. ``lzma`` is standard library but optional in a Python build: a host without it answers
``NO_LZMA`` at once, and the caller sends ``Probe.without_lzma()`` (the deflated zip of the
unchanged sources) on the same connection. The slimmed zip is built once per source tree and kept
in the user's cache (``$XDG_CACHE_HOME/kvforensics``), best effort.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import tempfile
import tokenize
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from collectors.probe import MARKER, VERSION, canonical
from collectors.snapshot import SCHEMA as SNAPSHOT_SCHEMA

REMOTE_COMMAND = "python3 -I -"  # constant: nothing the user types ever reaches a remote shell
_PACKAGE = Path(__file__).resolve().parents[2] / "collectors"

NO_LZMA = "KVFORENSICS-PROBE-NO-LZMA"
PACKINGS = ("xz", "zip")

_UNPACK = {
    "xz": """try:
    import lzma
except ImportError:
    sys.stdout.write({no_lzma!r} + chr(10))
    sys.exit(3)
_BLOB = lzma.decompress(base64.b85decode({{blob!r}}))""".format(no_lzma=NO_LZMA),
    "zip": "_BLOB = base64.b64decode({blob!r})",
}

_WRAPPER = '''\
import base64, hashlib, importlib.machinery, io, json, sys, zipfile
{unpack}
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


def _sources() -> List[Tuple[str, bytes]]:
    """collectors/**/*.py and pynvml.py, by name in the zip, in order."""
    out = [("collectors/" + p.relative_to(_PACKAGE).as_posix(), p.read_bytes()) for p in _PACKAGE.rglob("*.py")]
    nvml = _pynvml_source()
    if nvml is not None:
        out.append(("pynvml.py", nvml))
    return sorted(out)


def slim(source: bytes) -> bytes:
    """The module with comments and docstrings blanked and trailing blanks cut; every line stays where it
    was (a traceback from the host still names the source's line). The same code, but for ``__doc__``."""
    text = source.decode("utf-8")
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    cuts = []
    prev = tokenize.NEWLINE
    statement_start = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            cuts.append((tok.start, tok.end, ""))
        elif tok.type == tokenize.STRING and prev in statement_start:  # a string statement: a docstring
            lines = tok.end[0] - tok.start[0]
            cuts.append((tok.start, tok.end, '""' if not lines else '"""' + "\n" * lines + '"""'))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            prev = tok.type
    pieces, at = [], 0
    for (sl, sc), (el, ec), repl in cuts:
        a, b = starts[sl - 1] + sc, starts[el - 1] + ec
        pieces += [text[at:a], repl]
        at = b
    pieces.append(text[at:])
    return "".join(line.rstrip() + "\n" for line in "".join(pieces).splitlines()).encode("utf-8")


def _zip(files: List[Tuple[str, bytes]], method: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        for name, data in files:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = method
            zf.writestr(info, data)
    return buf.getvalue()


def code_zip() -> bytes:
    """collectors/**/*.py and pynvml.py, deterministic: same code, same bytes, same sha256 (deflated, as
    the sources are: the probe for a host without lzma)."""
    return _zip(_sources(), zipfile.ZIP_DEFLATED)


_SLIM_FORMAT = b"kvforensics-probe-slim/1"  # change it when slim() or _zip() changes what they make


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvforensics"


def slim_zip() -> bytes:
    """The zip the xz probe carries: stored entries, ``slim`` sources. Built once per source tree (the key
    hashes every source byte), then read from the user's cache; a cache that cannot be written is skipped."""
    files = _sources()
    key = hashlib.sha256(_SLIM_FORMAT + b"".join(hashlib.sha256(n.encode() + b"\0" + d).digest()
                                                  for n, d in files)).hexdigest()[:32]
    return _slim_zip_cached(key, tuple(files))


@lru_cache(maxsize=4)
def _slim_zip_cached(key: str, files: Tuple[Tuple[str, bytes], ...]) -> bytes:
    path = _cache_dir() / "probe-{}.zip".format(key)
    try:
        return path.read_bytes()
    except OSError:
        pass
    made = _zip([(n, slim(d)) for n, d in files], zipfile.ZIP_STORED)
    _keep(path, made)
    return made


def _keep(path: Path, data: bytes) -> None:
    """Write a cache file whole (temp file, rename) or not at all; a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=".probe-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, str(path))
    except OSError:
        pass


@lru_cache(maxsize=4)
def _xz(blob: bytes) -> bytes:
    """The xz stream of ``blob``: compressed once per code (~70 ms of CPU, every run before), then read from the
    user's cache beside the slim zip, and used only if it decompresses to ``blob`` exactly."""
    import lzma

    path = _cache_dir() / "probe-{}.xz".format(hashlib.sha256(_SLIM_FORMAT + blob).hexdigest()[:32])
    try:
        kept = path.read_bytes()
        if lzma.decompress(kept) == blob:
            return kept
    except (OSError, lzma.LZMAError, EOFError):
        pass
    # preset 9's 64 MiB window is 100 times the zip: a 1 MiB one packs the same, and the host's decoder
    # allocates that much, not 64 MiB.
    made = lzma.compress(blob, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32,
                         filters=[{"id": lzma.FILTER_LZMA2, "preset": 9, "dict_size": 1 << 20}])
    _keep(path, made)
    return made


@dataclass(frozen=True)
class Probe:
    script: bytes  # what goes on stdin
    code_sha256: str  # of the zip that runs (the xz probe's, decompressed)
    packing: str = "xz"
    options: str = ""  # base64 JSON, as in the script

    def without_lzma(self) -> "Probe":
        """The same probe for a host whose python3 has no lzma (it answered NO_LZMA): the deflated zip."""
        return _assemble(self.options, code_zip(), "zip")


def _assemble(encoded_options: str, blob: bytes, packing: str) -> Probe:
    # base85 carries the xz stream in 5/4 of its size where base64 takes 4/3: 6 KB less on every exec, for
    # ~5 ms of the host's CPU (b85decode is pure Python; measured 2026-12-01, 75 KB). The fallback zip keeps
    # base64: it goes to hosts whose Python lacks lzma, and is not the probe's usual cost.
    sent = _xz(blob) if packing == "xz" else blob
    text = base64.b85encode(sent) if packing == "xz" else base64.b64encode(sent)
    script = _WRAPPER.replace("{unpack}", _UNPACK[packing]).format(blob=text.decode("ascii"), options=encoded_options)
    return Probe(script.encode("utf-8"), hashlib.sha256(blob).hexdigest(), packing, encoded_options)


def build(options: Dict[str, Any], blob: Optional[bytes] = None, packing: str = "xz") -> Probe:
    """The probe script; ``blob``: the zip to carry (default: ``slim_zip()`` for xz, ``code_zip()`` for zip)."""
    if packing not in PACKINGS:
        raise ValueError("packing is one of {}".format(", ".join(PACKINGS)))
    encoded_options = base64.b64encode(json.dumps(options).encode("utf-8")).decode("ascii")
    if blob is None:
        blob = slim_zip() if packing == "xz" else code_zip()
    return _assemble(encoded_options, blob, packing)


def wants_lzma(stdout: bytes) -> bool:
    """The host's python3 has no lzma module: send ``Probe.without_lzma()`` instead."""
    return NO_LZMA.encode("ascii") in stdout


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
    return evidence.Checked(snap)  # checked once: the analysis types it without a second schema walk


def write(path: str, options: Optional[Dict[str, Any]] = None) -> Tuple[str, int]:
    """Write the exact probe script (for reading, or running by hand: python3 -I - < probe.py)."""
    probe = build(options or {})
    Path(path).write_bytes(probe.script)
    return probe.code_sha256, len(probe.script)
