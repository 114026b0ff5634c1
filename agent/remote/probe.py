"""Build the probe shipped to inspected hosts, and check what it answers.

The probe is one Python script sent on the SSH exec channel's stdin to a fixed command,
``python3 -I -`` (isolated mode: no user site, no cwd on sys.path). It carries the sources of
``collectors/`` (as ``kvforensics.collectors``) plus the part of nvidia-ml-py's ``pynvml.py`` they use, as one
JSON object (path → source), imported from memory by a small finder, so nothing is installed or written on the host.
Options travel as base64 JSON inside the script: data, never a command line. The JSON is
reproducible (sorted keys), so its sha256 identifies the code that ran; the probe echoes it and a
checksum of its snapshot. JSON, not a zip: the host parses it with the ``json`` it loads anyway,
where importing ``zipfile`` cost ~6 ms of every host's CPU.

On the wire (~48 KB of xz in ~64 KB of base64): comments and docstrings blanked (``slim``: every
line stays where it was, so a traceback still points at the source), pynvml cut to what
``collectors/nvml.py`` reaches (``agent/remote/shake.py``), the whole in one xz stream, which
compresses across files. ``lzma`` is standard library but optional in a Python build: a host
without it answers ``NO_LZMA`` at once, and the caller sends ``Probe.without_lzma()`` (the same
JSON of the unchanged sources, zlib-compressed) on the same connection. The slimmed JSON is built
once per source tree and kept in the user's cache (``$XDG_CACHE_HOME/kvforensics``), best effort.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import tokenize
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from kvforensics.agent.remote import usercache
from kvforensics.collectors.probe import MARKER, VERSION, canonical, sha256_hex
from kvforensics.collectors.probe import REMOTE_COMMAND as REMOTE_COMMAND  # the fleet's and kubectl's, from here

_PACKAGE = Path(__file__).resolve().parents[2] / "collectors"

NO_LZMA = "KVFORENSICS-PROBE-NO-LZMA"
PACKINGS = ("xz", "zlib")

_UNPACK = {
    "xz": """try:
    import lzma
except ImportError:
    sys.stdout.write({no_lzma!r} + chr(10))
    sys.exit(3)
_BLOB = lzma.decompress(base64.b64decode({{blob!r}}))""".format(no_lzma=NO_LZMA),
    "zlib": "_BLOB = zlib.decompress(base64.b64decode({blob!r}))",
}

_WRAPPER = '''\
import base64, importlib.machinery, json, os, sys, zlib
{unpack}
_OPTIONS = json.loads(base64.b64decode({options!r}).decode("utf-8"))
_SOURCES = json.loads(_BLOB.decode("ascii"))


class _FromMemory(object):
    """Finder and loader for the shipped modules (from the JSON above; nothing touches the disk).

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
from kvforensics.collectors import probe as _probe
_CODE = _probe.run(_OPTIONS, _probe.sha256_hex(_BLOB))
# The answer is written and flushed: exit now, without freeing every module and object one by one (the
# interpreter's teardown, ~5 ms of each host's CPU). No thread, no atexit hook, no file is left to finish.
sys.stdout.flush()
sys.stderr.flush()
os._exit(_CODE)
'''


def _pynvml_path() -> Optional[Path]:
    """nvidia-ml-py's pynvml.py, found without being run (importing it costs the client ~9 ms)."""
    import importlib.util

    spec = importlib.util.find_spec("pynvml")
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def _shipped_files() -> List[Tuple[str, Path]]:
    """The files the probe carries, by their names in the probe (collectors/**/*.py as kvforensics/collectors/…,
    and pynvml.py), in order. os.walk, not rglob: the index reads this list before every run's ssh starts."""
    out = []
    for top, _dirs, files in os.walk(str(_PACKAGE)):
        folder = os.path.relpath(top, str(_PACKAGE)).replace(os.sep, "/")
        prefix = "kvforensics/collectors/" + ("" if folder == "." else folder + "/")
        out += [(prefix + name, Path(top, name)) for name in files if name.endswith(".py")]
    nvml = _pynvml_path()
    if nvml is not None:
        out.append(("pynvml.py", nvml))
    return sorted(out)


# The package's own __init__ is not shipped: the probe needs its name (the collectors import each other as
# kvforensics.collectors.…), not its code.
_NAMESPACE_INIT = ("kvforensics/__init__.py", b"")


def _sources() -> List[Tuple[str, bytes]]:
    """What ``_shipped_files`` names, read, with the package's empty __init__: by their names in the probe, in order."""
    return sorted([(name, path.read_bytes()) for name, path in _shipped_files()] + [_NAMESPACE_INIT])


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


def _pack(files: List[Tuple[str, bytes]]) -> bytes:
    """One JSON object, path → source; ASCII and sorted, so the same code is the same bytes and sha256."""
    return json.dumps({n: d.decode("utf-8") for n, d in files}, sort_keys=True, separators=(",", ":")).encode("ascii")


def code_blob() -> bytes:
    """collectors/**/*.py and pynvml.py as they are: what the probe for a host without lzma carries."""
    return _pack(_sources())


_SLIM_FORMAT = b"kvforensics-probe-slim/4"  # change it when slim(), _shaken() or _pack() change what they make

# pynvml makes an exception class of every NVML_ERROR_* constant by scanning its own module at import.
_PYNVML_DYNAMIC = ("NVML_ERROR_",)


def _shaken(name: str, data: bytes) -> bytes:
    """pynvml.py cut to what collectors/nvml.py uses (15 KB of 330 KB: ~4 KB of xz instead of ~40 KB, and
    ~2 ms of the GPU host's CPU to compile instead of ~34); the other sources as they are."""
    if name != "pynvml.py":
        return data
    from kvforensics.agent.remote.shake import shake
    from kvforensics.collectors.nvml import PYNVML_USES

    return shake(data.decode("utf-8"), PYNVML_USES, _PYNVML_DYNAMIC).encode("utf-8")


def slim_blob() -> bytes:
    """The JSON the xz probe carries: ``slim`` sources, pynvml shaken. Built once per source tree (the key
    hashes every source byte), then read from the user's cache; a cache that cannot be written is skipped."""
    files = _sources()
    key = sha256_hex(_SLIM_FORMAT + b"".join(bytes.fromhex(sha256_hex(n.encode() + b"\0" + d))
                                             for n, d in files))[:32]
    return _slim_blob_cached(key, tuple(files))


@lru_cache(maxsize=4)
def _slim_blob_cached(key: str, files: Tuple[Tuple[str, bytes], ...]) -> bytes:
    path = Path(usercache.folder(), "probe-{}.json".format(key))
    try:
        return path.read_bytes()
    except OSError:
        pass
    made = _pack([(n, slim(_shaken(n, d))) for n, d in files])
    usercache.keep(path, made)
    return made


_XZ_NAME = re.compile(r"probe-[0-9a-f]{32}\.xz\Z")


def _xz_path(blob: bytes) -> Path:
    return Path(usercache.folder(), "probe-{}.xz".format(sha256_hex(_SLIM_FORMAT + blob)[:32]))


@lru_cache(maxsize=4)
def _xz(blob: bytes) -> bytes:
    """The xz stream of ``blob``: compressed once per code (~70 ms of CPU, every run before), then read from the
    user's cache beside the slim JSON, and used only if it decompresses to ``blob`` exactly."""
    import lzma

    path = _xz_path(blob)
    try:
        kept = path.read_bytes()
        if lzma.decompress(kept) == blob:
            return kept
    except (OSError, lzma.LZMAError, EOFError):
        pass
    # preset 9's 64 MiB window is 100 times the JSON: a 1 MiB one packs the same, and the host's decoder
    # allocates that much, not 64 MiB.
    made = lzma.compress(blob, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32,
                         filters=[{"id": lzma.FILTER_LZMA2, "preset": 9, "dict_size": 1 << 20}])
    usercache.keep(path, made)
    return made


@dataclass(frozen=True)
class Probe:
    """The script a host's python3 runs from stdin, with the hash of the sources it carries and how they are packed."""

    script: bytes  # what goes on stdin
    code_sha256: str  # of the JSON of sources that runs (decompressed)
    packing: str = "xz"
    options: str = ""  # base64 JSON, as in the script

    def without_lzma(self) -> "Probe":
        """The same probe for a host whose python3 has no lzma (it answered NO_LZMA): zlib, sources unchanged."""
        return _assemble(self.options, code_blob(), "zlib")


def _assemble(encoded_options: str, blob: bytes, packing: str) -> Probe:
    # base64, not base85: b85decode is pure Python (~5 ms of the host's CPU for a 75 KB stream, measured
    # 2026-12-01), b64decode is C; with pynvml shaken the stream is ~45 KB, and base85's 5/4 would save 4 KB.
    text = base64.b64encode(_xz(blob) if packing == "xz" else zlib.compress(blob, 9))
    return _script(encoded_options, text, packing, sha256_hex(blob))


def _script(encoded_options: str, text: bytes, packing: str, code_sha256: str) -> Probe:
    script = _WRAPPER.replace("{unpack}", _UNPACK[packing]).format(blob=text.decode("ascii"), options=encoded_options)
    return Probe(script.encode("utf-8"), code_sha256, packing, encoded_options)


def build(options: Dict[str, Any], blob: Optional[bytes] = None, packing: str = "xz") -> Probe:
    """The probe script; ``blob``: the JSON of sources to carry (default: ``slim_blob()`` for xz, ``code_blob()``
    for zlib)."""
    if packing not in PACKINGS:
        raise ValueError("packing is one of {}".format(", ".join(PACKINGS)))
    encoded_options = base64.b64encode(json.dumps(options).encode("utf-8")).decode("ascii")
    key = _stat_key() if blob is None and packing == "xz" else None  # this source tree's own probe: indexed
    kept = _indexed_xz(key) if key is not None else None
    if kept is not None:  # the common case: packed by an earlier run
        xz, code_sha256 = kept
        return _script(encoded_options, base64.b64encode(xz), "xz", code_sha256)
    if blob is None:
        blob = slim_blob() if packing == "xz" else code_blob()
    made = _assemble(encoded_options, blob, packing)
    if key is not None:
        _index(key, made.code_sha256, blob)
    return made


# Every run used to read the ~60 sources to find its cache key, then decompress the kept xz to check it: ~20 ms of
# the one-host inspect, before ssh could start. The index names the probe of a source tree by what os.stat says of
# its files (name, size, mtime), and gives the sha256 of the JSON it carries and of its xz stream: a run reads two
# small files and hashes 48 KB. The xz file is used only if its bytes hash as the index says (a torn or stale
# cache is rebuilt, never sent).
_INDEX_FORMAT = "kvforensics-probe-index/1"


def _stat_key() -> Optional[str]:
    """The index's key for the files ``_shipped_files`` names, from what os.stat says of them; None where one
    cannot be stat'ed (the probe is then packed from its sources)."""
    said = [_INDEX_FORMAT + "\0" + _SLIM_FORMAT.decode()]
    try:
        for name, path in _shipped_files():
            st = path.stat()
            said.append("{}\0{}\0{}\0{}\0".format(name, path, st.st_size, st.st_mtime_ns))
    except OSError:
        return None
    return sha256_hex("".join(said).encode())[:32]


def _index_path(key: str) -> Path:
    return Path(usercache.folder(), "probe-index-{}".format(key))


def _indexed_xz(key: str) -> Optional[Tuple[bytes, str]]:
    """(the xz stream, the sha256 of the JSON it carries) of the probe the index names under ``key``, or None."""
    try:
        code_sha256, xz_sha256, name = _index_path(key).read_text("ascii").split()
        if not _XZ_NAME.match(name):
            return None
        xz = Path(usercache.folder(), name).read_bytes()
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return (xz, code_sha256) if sha256_hex(xz) == xz_sha256 else None


def _index(key: str, code_sha256: str, blob: bytes) -> None:
    xz, path = _xz(blob), _xz_path(blob)
    if not path.exists():  # _xz remembers streams per process: one packed before the cache moved
        usercache.keep(path, xz)
    line = "{} {} {}\n".format(code_sha256, sha256_hex(xz), path.name)
    usercache.keep(_index_path(key), line.encode("ascii"))


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
    from kvforensics.agent.model import evidence

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
    if sha256_hex(canonical(snap).encode("ascii")) != answer.get("checksum"):
        raise ProbeError("probe.checksum", "the probe's snapshot failed its checksum")
    from kvforensics.collectors.snapshot import SCHEMA as SNAPSHOT_SCHEMA  # after the answer: not before ssh starts

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
