"""Read a model's ``config.json`` (a file, a model directory, or a Hugging Face cache entry).

Only reading lives here; what the architecture means for KV bytes is ``agent/kv_geometry.py``.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

NAME = "model_config"


class ModelConfigError(Exception):
    """The config cannot be found or parsed; the message is one actionable sentence."""


def find_config(path: str) -> Optional[str]:
    """``path`` itself, ``path/config.json``, or the newest ``snapshots/*/config.json``
    of a Hugging Face cache entry (``models--org--name``)."""
    if os.path.isfile(path):
        return path
    direct = os.path.join(path, "config.json")
    if os.path.isfile(direct):
        return direct
    import glob  # only for a Hugging Face cache folder

    snaps = glob.glob(os.path.join(path, "snapshots", "*", "config.json"))
    if snaps:
        return max(snaps, key=os.path.getmtime)
    return None


def locate(model_path: str, env: Optional[Dict[str, str]] = None, home: Optional[str] = None) -> Optional[str]:
    """config.json for a --model-path: a directory, or a hub id ("org/name") in a HF cache."""
    found = find_config(model_path)
    if found:
        return found
    if model_path.count("/") != 1 or model_path.startswith(("/", ".")):
        return None
    env = env or {}
    folder = "models--" + model_path.replace("/", "--")
    caches = [env.get("HF_HUB_CACHE"), os.path.join(env["HF_HOME"], "hub") if env.get("HF_HOME") else None,
              os.path.join(home, ".cache", "huggingface", "hub") if home else None,
              os.path.expanduser("~/.cache/huggingface/hub")]
    for cache in caches:
        if cache:
            found = find_config(os.path.join(cache, folder))
            if found:
                return found
    return None


def load_model_config(path: str) -> Dict[str, Any]:
    found = find_config(path)
    if found is None:
        raise ModelConfigError("{}: no config.json there (pass the file, the model directory, "
                               "or its Hugging Face cache folder)".format(path))
    try:
        with open(found, "r", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError("{}: cannot read: {}".format(found, exc)) from None
    except json.JSONDecodeError as exc:
        raise ModelConfigError("{}: not valid JSON (line {}, column {})".format(found, exc.lineno, exc.colno)) from None
    if not isinstance(data, dict):
        raise ModelConfigError("{}: expected a JSON object".format(found))
    return data
