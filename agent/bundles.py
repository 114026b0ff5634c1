"""Evidence bundles: a snapshot saved as one JSON file, to re-analyse anywhere (``inspect --from``).

A bundle holds what was collected (raw NVML answers, process excerpts with secrets redacted,
the startup's log lines, the model config, live metrics), not conclusions: a newer kvforensics
re-reads an old bundle with its newer rules. Written atomically (temp file + rename).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict

from collectors.snapshot import SCHEMA


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


def load(path: str) -> Dict[str, Any]:
    try:
        with open(path, "r", encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise BundleError("{}: no such file".format(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BundleError("{}: cannot read: {}".format(path, exc)) from None
    except json.JSONDecodeError as exc:
        raise BundleError("{}: not JSON (line {}): not a kvforensics bundle".format(path, exc.lineno)) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise BundleError("{}: not a kvforensics bundle (expected schema {})".format(path, SCHEMA))
    return data
