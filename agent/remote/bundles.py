"""Evidence bundles: a snapshot saved as one JSON file, to re-analyse anywhere (``inspect --from``);
``--from`` also reads the probe's own answer, verified.

A bundle holds what was collected (raw NVML answers, process excerpts with secrets redacted,
the startup's log lines, the model config, live metrics), not conclusions: a newer kvforensics
re-reads an old bundle with its newer rules. Written atomically (temp file + rename).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict

from kvforensics.collectors.probe import MARKER
from kvforensics.collectors.snapshot import SCHEMA


class BundleError(Exception):
    """The file is not a readable kvforensics bundle; one sentence."""


def save(snapshot: Dict[str, Any], path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path)) or "."
    fd, tmp = tempfile.mkstemp(prefix=".kvf-bundle-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(snapshot, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# A real bundle is well under 1 MB; the cap is an SSH host's answer's (a probe's own output is one too).
# Whatever is under it is costed before it is parsed (evidence.check_shape), so no bundle takes more
# than ~4× its size while it is read.
MAX_BUNDLE_BYTES = 64 << 20


def load(path: str) -> Dict[str, Any]:
    """The bundle's snapshot, validated against the published snapshot schema."""
    from kvforensics.agent.model import evidence

    raw = _read(path)
    if _has_marker_line(raw):  # noise around it may be any bytes
        return _probe_answer(path, raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BundleError("{}: not UTF-8 text: not a kvforensics bundle".format(path)) from None
    del raw  # the text alone is kept while it is parsed
    try:
        data = evidence.loads(text)
    except evidence.EvidenceError as exc:
        raise BundleError("{}: {}: not a kvforensics bundle".format(path, exc)) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise BundleError("{}: not a kvforensics bundle (expected schema {})".format(path, SCHEMA))
    try:
        evidence.check("snapshot", data)
    except evidence.EvidenceError as exc:
        raise BundleError("{}: not a valid kvforensics bundle: {}".format(path, exc)) from None
    return data


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BUNDLE_BYTES + 1)
    except FileNotFoundError:
        raise BundleError("{}: no such file".format(path)) from None
    except OSError as exc:
        raise BundleError("{}: cannot read: {}".format(path, exc)) from None
    if len(raw) > MAX_BUNDLE_BYTES:
        raise BundleError("{}: larger than {} MiB: not a kvforensics bundle".format(path, MAX_BUNDLE_BYTES >> 20))
    return raw


def _has_marker_line(raw: bytes) -> bool:
    """A line that begins with the probe's marker (found in place: a list of every line of a file of
    newlines would take many times its size)."""
    marker = MARKER.encode()
    return raw.startswith(marker) or b"\n" + marker in raw or b"\r" + marker in raw


def _probe_answer(path: str, raw: bytes) -> Dict[str, Any]:
    """What ``kvforensics probe -o FILE`` printed when run by hand (``KVF-PROBE {…}``, login noise around it
    allowed), verified as an SSH host's answer is: protocol version, the sha256 of the code that ran (this
    kvforensics's probe), the snapshot's checksum and the snapshot schema."""
    from kvforensics.agent.remote import probe

    try:
        return probe.parse_answer(raw, probe.build({}))
    except probe.ProbeError as exc:
        if exc.code == "probe.code_mismatch":
            raise BundleError("{}: the probe that printed this is not the one this kvforensics ships (another "
                              "version?): run the one `kvforensics probe -o FILE` writes".format(path)) from None
        raise BundleError("{}: {}".format(path, exc.message)) from None
