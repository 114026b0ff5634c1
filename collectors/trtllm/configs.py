"""TensorRT-LLM's settings that live in files its command line names, read on the inspected host.

* trtllm-serve's ``--extra_llm_api_options FILE`` / ``--config FILE`` (a YAML of LLM-API arguments that overrides
  the command line: tensorrt_llm/commands/serve.py) and Dynamo's ``--extra-engine-args FILE``:
  ``kv_cache_config: {free_gpu_memory_fraction, max_tokens, max_gpu_total_bytes, host_cache_size, dtype}``,
  ``scheduler_config: {capacity_scheduler_policy}``, ``max_batch_size``, ``max_num_tokens``, ``max_seq_len``,
  ``tensor_parallel_size``.
* Triton's ``--model-repository DIR``: the ``config.pbtxt`` of the model whose ``backend`` is ``tensorrtllm``
  (tensorrtllm_backend all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt), whose parameters are
  ``parameters: { key: "kv_cache_free_gpu_mem_fraction" value: { string_value: "0.9" } }``.

Only the keys below are taken, as numbers or short words; nothing else of a file is kept. A file is read only
when it is a regular file of at most ``MAX_CONFIG_BYTES`` owned by root or by the server's own user (a local
user cannot make kvforensics read someone else's file by naming it on a command line), through the process's
own root and working directory (a container's paths are its own). Standard library only: this runs in the probe.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any, Dict, List, Optional, Tuple

MAX_CONFIG_BYTES = 256 << 10
MAX_MODELS = 64  # model folders looked at in a Triton repository
_WORD = re.compile(r"^[A-Za-z0-9_.+-]{1,64}\Z")

# YAML path → the flag name kvforensics reads (collectors/trtllm/processes.py's names).
YAML_KEYS = {
    ("kv_cache_config", "free_gpu_memory_fraction"): "kv_cache_free_gpu_memory_fraction",
    ("kv_cache_config", "max_tokens"): "max_tokens",
    ("kv_cache_config", "max_gpu_total_bytes"): "max_gpu_total_bytes",
    ("kv_cache_config", "host_cache_size"): "host_cache_size",
    ("kv_cache_config", "dtype"): "kv_cache_dtype",
    ("kv_cache_config", "enable_block_reuse"): "enable_block_reuse",
    ("scheduler_config", "capacity_scheduler_policy"): "capacity_scheduler_policy",
    ("max_batch_size",): "max_batch_size", ("max_num_tokens",): "max_num_tokens", ("max_seq_len",): "max_seq_len",
    ("tensor_parallel_size",): "tp_size", ("pipeline_parallel_size",): "pp_size", ("backend",): "backend",
}
# Triton's parameter → the same names.
PBTXT_KEYS = {
    "kv_cache_free_gpu_mem_fraction": "kv_cache_free_gpu_memory_fraction",
    "max_tokens_in_paged_kv_cache": "max_tokens", "kv_cache_host_memory_bytes": "host_cache_size",
    "batch_scheduler_policy": "capacity_scheduler_policy", "enable_kv_cache_reuse": "enable_block_reuse",
    "max_attention_window_size": "max_attention_window", "max_beam_width": "max_beam_width",
}
_FILE_FLAGS = ("extra_llm_api_options", "config", "extra_engine_args")


def scalar(text: str) -> Any:
    """A YAML or pbtxt scalar as kvforensics keeps it: a bounded number, a bool, a short word, else None."""
    text = text.strip().strip("'\"")
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none", "~", ""):
        return None
    try:
        value = float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        return text if _WORD.match(text) else None
    return value if -1e18 <= value <= 1e18 and value == value else None


def _flow_map(text: str) -> Dict[str, Any]:
    """``{a: 1, b: x}`` (one level) as a dict."""
    out: Dict[str, Any] = {}
    for item in text.strip()[1:-1].split(","):
        key, sep, value = item.partition(":")
        if sep and key.strip():
            out[key.strip().strip("'\"")] = scalar(value)
    return out


def parse_yaml(text: str) -> Dict[Tuple[str, ...], Any]:
    """The scalar leaves of a block-style YAML (two levels deep, flow maps allowed as values), by key path. Lists,
    anchors and multi-line strings are skipped, not misread."""
    leaves: Dict[Tuple[str, ...], Any] = {}
    parent: Optional[str] = None
    parent_indent = -1
    for raw in text.splitlines()[:20000]:
        line = raw.split(" #", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith(("#", "-", "---")):
            continue
        indent = len(line) - len(line.lstrip(" "))
        key, sep, value = line.strip().partition(":")
        if not sep or not re.match(r"^[A-Za-z_][\w-]{0,63}\Z", key):
            continue
        value = value.strip()
        if indent == 0:
            parent, parent_indent = (key, indent) if not value else (None, -1)
            if value.startswith("{") and value.endswith("}"):
                leaves.update({(key, k): v for k, v in _flow_map(value).items()})
            elif value and not value.startswith(("&", "*", "|", ">", "[")):
                leaves[(key,)] = scalar(value)
        elif parent is not None and indent > parent_indent and value and not value.startswith(("|", ">", "[", "{")):
            leaves[(parent, key)] = scalar(value)
    return leaves


_PARAM = re.compile(r'key:\s*"(?P<key>[A-Za-z_]\w{0,63})"\s*value:\s*\{\s*string_value:\s*"(?P<value>[^"]{0,200})"')
_BACKEND = re.compile(r'^\s*backend:\s*"(?P<backend>[\w-]{1,64})"', re.M)


def parse_pbtxt(text: str) -> Tuple[Optional[str], Dict[str, Any]]:
    """(the model's backend, its parameters kvforensics reads); a template's ``${…}`` placeholder is no value."""
    m = _BACKEND.search(text)
    params: Dict[str, Any] = {}
    for p in _PARAM.finditer(text):
        name = PBTXT_KEYS.get(p.group("key"))
        if name is not None and not p.group("value").startswith("${"):
            value = scalar(p.group("value"))
            if value is not None:
                params[name] = value
    return (m.group("backend") if m else None), params


def _read_owned(path: str, uid: Optional[int]) -> Tuple[Optional[str], str]:
    """(text, "") of a regular file of root or ``uid``, at most MAX_CONFIG_BYTES; (None, why not) otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return None, "cannot open it ({})".format(exc.strerror or exc)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file"
        if st.st_uid not in (0, uid):
            return None, "owned by uid {}, neither root nor the server's user".format(st.st_uid)
        if st.st_size > MAX_CONFIG_BYTES:
            return None, "larger than {} KiB".format(MAX_CONFIG_BYTES >> 10)
        data = os.read(fd, MAX_CONFIG_BYTES + 1)[:MAX_CONFIG_BYTES]
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace"), ""


def _in_process(root: str, pid: int, path: str) -> Tuple[str, str]:
    """(where to open ``path`` as the process sees it, how to name it): through its root, from its working folder."""
    base = os.path.join(root, "proc", str(pid))
    if not os.path.isabs(path):
        try:
            path = os.path.join(os.readlink(os.path.join(base, "cwd")), path)
        except OSError:
            return "", path
    return os.path.join(base, "root") + os.path.normpath(path), os.path.normpath(path)


def config_flags(root: str, pid: int, uid: Optional[int], flags: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """(flags from the files the server's command line names, notes on files not read)."""
    out: Dict[str, Any] = {}
    notes: List[str] = []
    for key in _FILE_FLAGS:
        named = flags.get(key)
        if not isinstance(named, str) or not named:
            continue
        where, shown = _in_process(root, pid, named)
        text, why = _read_owned(where, uid) if where else (None, "its working folder is unknown")
        if text is None:
            notes.append("--{} {}: not read, {}".format(key, shown[:200], why))
            continue
        leaves = parse_yaml(text)
        out.update({name: leaves[path] for path, name in YAML_KEYS.items() if leaves.get(path) is not None})
        out["config_file"] = shown[:200]
    repo = flags.get("model_repository")
    if isinstance(repo, str) and repo:
        found, more = _triton(root, pid, uid, repo)
        out.update(found)
        notes.extend(more)
    return out, notes


def _triton(root: str, pid: int, uid: Optional[int], repo: str) -> Tuple[Dict[str, Any], List[str]]:
    where, shown = _in_process(root, pid, repo)
    try:
        models = sorted(os.listdir(where))[:MAX_MODELS] if where else []
    except OSError as exc:
        return {}, ["--model-repository {}: not read ({})".format(shown[:200], exc.strerror or exc)]
    for model in models:
        text, _ = _read_owned(os.path.join(where, model, "config.pbtxt"), uid)
        if text is None:
            continue
        backend, params = parse_pbtxt(text)
        if backend == "tensorrtllm":
            params["config_file"] = os.path.join(shown, model, "config.pbtxt")[:200]
            return params, []
    return {}, []
