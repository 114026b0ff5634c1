"""The user's cache folder for what a run can reuse from the last one (the packed probe, the ssh client's
version): ``$XDG_CACHE_HOME/kvforensics``, else ``~/.cache/kvforensics``. Best effort: a file is written whole
(a temporary file, then a rename) or not at all, and a cache that cannot be read or written is skipped, never an
error."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["folder", "keep"]


def folder() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvforensics"


def keep(path: Path, data: bytes) -> None:
    import tempfile  # here: most runs only read the cache, and tempfile (with random) is ~1 ms before ssh starts

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, str(path))
    except OSError:
        pass
