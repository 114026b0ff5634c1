"""The Prometheus textfile on disk: whose file it is, and writing ours.

``record`` runs as root from cron, and prometheus-client writes a textfile by renaming a new file over the
path it is given. A typo in ``--prom-file`` (another exporter's ``smartmon.prom`` in the same directory, a
symlink someone made, a FIFO) would then replace what is not ours. So, as for ``--db``'s history
(agent/history/store.py), only our own file is ever replaced: a path that does not exist, an empty file, or
a regular file whose every metric is a ``kvforensics_`` one. Anything else is refused before sampling and
again just before writing, in one line, and left exactly as it was. Only a regular file is ever opened (a
FIFO would block, a device may act on open).
"""

from __future__ import annotations

import os
import stat
from typing import Any, Optional

from agent.history.filekind import kind_of

PREFIX = "kvforensics_"
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
        return
    if st.st_size > MAX_OURS_BYTES:
        raise _refuse(path, "is larger ({:,} bytes) than any textfile kvforensics writes".format(st.st_size))
    foreign = _foreign_metric(_read_regular(path))
    if foreign is not None:
        raise _refuse(path, foreign)


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
    """Our textfile, if ``path`` is ours to replace (claim), written atomically: prometheus-client writes
    ``PATH.<pid>.<thread>`` and renames it into place. A run killed inside that window leaves its temporary
    file: the next run removes any whose writer is gone."""
    import glob
    import re

    from prometheus_client import write_to_textfile

    claim(path)
    for stale in glob.glob(glob.escape(path) + ".*"):
        m = re.match(re.escape(path) + r"\.(\d+)\.\d+$", stale)
        if m and not os.path.exists("/proc/{}".format(m.group(1))):
            try:
                os.unlink(stale)
            except OSError:
                pass
    write_to_textfile(path, reg)
