"""The Prometheus textfile on disk: whose file it is, and writing ours.

``record`` runs as root from cron, and prometheus-client writes a textfile by renaming a new file over the
path it is given. A typo in ``--prom-file`` (another exporter's ``smartmon.prom`` in the same directory, a
symlink someone made, a FIFO, an empty lock file) would then replace what is not ours. So, as for ``--db``'s
history (agent/history/store.py), only a file that is provably ours is ever replaced: a path that does not
exist, or a regular file that begins with our own header line (HEADER, written by every run) and holds only
``kvforensics_`` metrics. A file written before the header existed counts as ours when it declares
``kvforensics_`` metrics (``# HELP kvforensics_…``) and holds no other; an empty file, or one of comments
only, is not. Anything else is refused before sampling and again just before writing, in one line, and left
exactly as it was. Only a regular file is ever opened (a FIFO would block, a device may act on open).

Writing is ours too: the text goes into ``PATH.kvforensics-tmp.<random>`` (O_EXCL, never a link, not
``*.prom`` so node_exporter never reads it half-written), then is renamed over PATH. A temporary a killed run
left is removed by a later run only when its name is exactly that shape, it is a regular file of ours and it
begins with HEADER: never by guessing from a PID in another program's file name.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from typing import Any, Optional

from kvforensics.agent.history import fresh_file
from kvforensics.agent.history.filekind import kind_of

PREFIX = "kvforensics_"
HEADER = "# kvforensics textfile: written by `kvforensics record`; replaced on every run, do not edit"
_HEADER_LINE = HEADER.encode() + b"\n"
TEMP_MARK = ".kvforensics-tmp."
STALE_TEMP_S = 600  # a temporary older than this is a killed run's, not a run still writing
# What a textfile of ours can weigh: a few KB per engine and GPU. A bigger file is not one we wrote.
MAX_OURS_BYTES = 4 << 20


class Refused(Exception):
    """The path holds something that is not our textfile; nothing was written."""


def _refuse(path: str, what: str) -> Refused:
    return Refused("{} {}, not a kvforensics textfile; it was left as it is (record renames a new file over "
                   "--prom-file)".format(path, what))


def claim(path: str) -> None:
    """Return if ``path`` may be replaced by our textfile; raise Refused (or OSError) if not."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, "is " + kind_of(st.st_mode))
    if st.st_size == 0:
        raise _refuse(path, "is an empty file (another program's, or a lock file)")
    if st.st_size > MAX_OURS_BYTES:
        raise _refuse(path, "is larger ({:,} bytes) than any textfile kvforensics writes".format(st.st_size))
    data = _read_regular(path)
    foreign = _foreign_metric(data)
    if foreign is not None:
        raise _refuse(path, foreign)
    if not (data.startswith(_HEADER_LINE) or b"# HELP " + PREFIX.encode() in data):
        raise _refuse(path, "holds no kvforensics metric (comments only)")


def _read_regular(path: str) -> bytes:
    """The file's bytes, opened without following a link or blocking, and only if it is still a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _refuse(path, "is not a regular file")
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            if sum(len(c) for c in chunks) > MAX_OURS_BYTES:
                raise _refuse(path, "is larger than any textfile kvforensics writes")
    finally:
        os.close(fd)


def _foreign_metric(data: bytes) -> Optional[str]:
    """Why these bytes are not a textfile of ours, or None: every HELP, TYPE and sample line names a
    kvforensics_ metric."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "is not a Prometheus textfile (not UTF-8)"
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "#":
            if len(words) >= 3 and words[1] in ("HELP", "TYPE") and not words[2].startswith(PREFIX):
                return "holds another exporter's metric {}".format(words[2][:80])
            continue
        name = line.split("{", 1)[0].split(None, 1)[0]
        if not name.startswith(PREFIX):
            return "holds another exporter's metric {}".format(name[:80])
    return None


def write(path: str, reg: Any) -> None:
    """Our textfile, if ``path`` is ours to replace (claim): HEADER and the registry's exposition, written into
    a fresh temporary beside it and renamed into place; stale temporaries of ours removed first."""
    from prometheus_client.exposition import generate_latest

    claim(path)
    _remove_stale_temporaries(path)
    text = _HEADER_LINE + (generate_latest(reg) if reg is not None else b"")
    folder, name = os.path.split(os.path.abspath(path))
    temp = os.path.join(folder, name + TEMP_MARK + secrets.token_hex(8))
    # 0644: node_exporter runs as its own user and must read what root wrote; claimed again just before the
    # rename, as another program may have put its file there meanwhile
    fresh_file.replace(temp, path, text, 0o644, before_rename=lambda: claim(path))


def _remove_stale_temporaries(path: str) -> None:
    """Temporaries a killed run of ours left beside ``path``: exactly our name shape, a regular file of ours,
    older than STALE_TEMP_S, beginning with HEADER. Anything else is left alone, whoever wrote it."""
    import glob
    import time

    pattern = re.compile(re.escape(os.path.basename(path) + TEMP_MARK) + r"[0-9a-f]{16}")
    for stale in glob.glob(glob.escape(path) + glob.escape(TEMP_MARK) + "*"):
        if not pattern.fullmatch(os.path.basename(stale)):
            continue
        try:
            st = os.lstat(stale)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or time.time() - st.st_mtime < STALE_TEMP_S:
                continue
            if _read_regular(stale).startswith(_HEADER_LINE):
                os.unlink(stale)
        except (OSError, Refused):
            continue
