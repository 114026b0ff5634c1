"""SGLang processes on this node: servers, their scheduler processes (one per GPU rank), flags.

Processes are recognised by their command line, not the 15-character ``comm``: the server
keeps ``python -m sglang.launch_server …`` / ``sglang serve …``; schedulers are renamed by
setproctitle to ``sglang::scheduler_TP3`` / ``sglang::scheduler_DP1_TP3`` (research §7.1;
a tp=1, dp=1 scheduler is plain ``sglang::scheduler`` since 0.4.7). Flags are parsed the way
SGLang's argparse reads them: aliases and unique prefixes (``--tp 8`` is ``--tp-size 8``).

Output: ``{"status", "engines": [{"server": process|None, "schedulers": [process + "rank"],
"helpers": [process], "server_args": {...}, "launch": "launch_server"|"serve"|None}],
"problems": [...]}`` (process dicts from ``collectors/procfs.py``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from collectors import procfs
from collectors.redact import redact_argv, redact_mapping

NAME = "engines"

# canonical dest -> spellings SGLang accepts (research §7.3, §5)
_ALIASES = {
    "model_path": ("--model-path", "--model"),
    "tp_size": ("--tp-size", "--tensor-parallel-size"),
    "dp_size": ("--dp-size", "--data-parallel-size"),
    "pp_size": ("--pp-size", "--pipeline-parallel-size"),
    "ep_size": ("--ep-size", "--expert-parallel-size", "--ep"),
    "enable_hierarchical_cache": ("--enable-hierarchical-cache", "--enable-hicache"),
}
# Long options SGLang defines that kvforensics reads; used for argparse's prefix matching.
_KNOWN = (
    "--model-path", "--tokenizer-path", "--served-model-name", "--context-length", "--dtype", "--quantization",
    "--mem-fraction-static", "--max-total-tokens", "--max-running-requests", "--max-prefill-tokens",
    "--chunked-prefill-size", "--page-size", "--kv-cache-dtype", "--tp-size", "--dp-size", "--pp-size",
    "--ep-size", "--enable-dp-attention", "--attn-dp-size", "--speculative-algorithm",
    "--speculative-draft-model-path", "--speculative-num-steps", "--speculative-eagle-topk",
    "--speculative-num-draft-tokens", "--cuda-graph-max-bs", "--cuda-graph-bs", "--disable-cuda-graph",
    "--enable-hierarchical-cache", "--hicache-ratio", "--hicache-size", "--hicache-write-policy",
    "--hicache-storage-backend", "--hicache-mem-layout", "--enable-metrics", "--host", "--port",
    "--log-level", "--trust-remote-code", "--disable-radix-cache", "--api-key", "--attention-backend",
    "--swa-full-tokens-ratio", "--max-mamba-cache-size", "--enable-torch-compile", "--schedule-policy",
    "--tensor-parallel-size", "--data-parallel-size", "--pipeline-parallel-size", "--expert-parallel-size",
    "--enable-hicache", "--model",
)
# Flags that take no value (store_true): any --enable-*/--disable-* plus these.
_SWITCHES = ("--trust-remote-code", "--skip-tokenizer-init", "--is-embedding", "--enable-metrics")


def _dest(option: str) -> str:
    for dest, spellings in _ALIASES.items():
        if option in spellings:
            return dest
    return option.lstrip("-").replace("-", "_")


def _resolve(option: str) -> str:
    """argparse's unique-prefix rule over the options we know; unknown options stay as given."""
    if option in _KNOWN:
        return option
    matches = [k for k in _KNOWN if k.startswith(option)]
    dests = {_dest(m) for m in matches}
    return matches[0] if len(dests) == 1 else option


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    if text in ("None", "null"):
        return None
    return text


def parse_flags(argv: List[str]) -> Dict[str, Any]:
    """SGLang server args from a command line (everything after the launch form)."""
    args: Dict[str, Any] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--"):
            if i == 0 and "model_path" not in args:  # `sglang serve <model>` (0.5.23)
                args["model_path"] = token
            i += 1
            continue
        name, eq, inline = token.partition("=")
        option = _resolve(name)
        dest = _dest(option)
        if eq:
            args[dest] = _value(inline)
        elif option.startswith(("--enable-", "--disable-")) or option in _SWITCHES:
            args[dest] = True
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            args[dest] = _value(argv[i + 1])
            i += 1
        else:
            args[dest] = True
        i += 1
    return args


def classify(argv: List[str]) -> Optional[Dict[str, Any]]:
    """("server", launch form, flags start) / ("scheduler", rank) / ("helper", title) or None."""
    if not argv:
        return None
    head = argv[0]
    if head.startswith("sglang::scheduler"):
        suffix = head[len("sglang::scheduler"):].strip("_ ")
        return {"role": "scheduler", "rank": " ".join(t for t in suffix.split("_") if t)}
    if head.startswith("sglang::"):
        return {"role": "helper", "title": head}
    for i, token in enumerate(argv[:4]):
        if token == "sglang.launch_server" or token.endswith("/sglang/launch_server.py"):
            return {"role": "server", "launch": "launch_server", "flags_at": i + 1}
        if token.rsplit("/", 1)[-1] == "sglang" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return {"role": "server", "launch": "serve", "flags_at": i + 2}
    return None


def collect(root: str = "/") -> Dict[str, Any]:
    servers: List[Dict[str, Any]] = []
    schedulers: List[Dict[str, Any]] = []
    helpers: List[Dict[str, Any]] = []
    for pid in procfs.pids(root):
        argv = procfs.cmdline(root, pid)
        kind = classify(argv or [])
        if kind is None:
            continue
        proc = procfs.process(root, pid, redact_argv(argv or []))
        if proc is None:
            continue
        if kind["role"] == "server":
            proc["launch"] = kind["launch"]
            proc["server_args"] = redact_mapping(parse_flags((argv or [])[kind["flags_at"]:]))
            servers.append(proc)
        elif kind["role"] == "scheduler":
            proc["rank"] = kind["rank"]
            schedulers.append(proc)
        else:
            proc["title"] = kind["title"]
            helpers.append(proc)
    engines = []
    by_pid = {s["pid"]: {"server": s, "schedulers": [], "helpers": [], "server_args": s["server_args"],
                          "launch": s["launch"]} for s in sorted(servers, key=lambda p: p["pid"])}
    orphans: Dict[str, Any] = {"server": None, "schedulers": [], "helpers": [], "server_args": {}, "launch": None}
    parents = {p["pid"]: p.get("ppid") for p in servers + schedulers + helpers}
    for proc, key in [(s, "schedulers") for s in schedulers] + [(h, "helpers") for h in helpers]:
        owner = _owner(proc, by_pid, parents, root)
        (by_pid[owner] if owner is not None else orphans)[key].append(proc)
    engines = list(by_pid.values())
    if orphans["schedulers"]:
        engines.append(orphans)
    for e in engines:
        e["schedulers"].sort(key=lambda p: _rank_key(p["rank"]))
    problems = []
    if orphans["schedulers"]:
        pids = ", ".join(str(p["pid"]) for p in orphans["schedulers"])
        problems.append({"code": "engines.server_not_found",
                         "message": "scheduler processes without a visible server process (its command line "
                                    "holds the flags): {}".format(pids)})
    return {"status": "ok" if engines else "absent", "engines": engines, "problems": problems}


def _owner(proc: Dict[str, Any], servers: Dict[int, Any], parents: Dict[int, Any], root: str) -> Optional[int]:
    """Walk parent PIDs up to a server process (schedulers are its multiprocessing children)."""
    pid = proc.get("ppid")
    for _ in range(8):
        if pid is None or pid <= 1:
            return None
        if pid in servers:
            return pid
        parent = parents.get(pid)
        if parent is None:
            info = procfs.process(root, pid)
            parent = info.get("ppid") if info else None
        pid = parent
    return None


def _rank_key(rank: str) -> List[Any]:
    out: List[Any] = []
    for token in rank.split():
        name = token.rstrip("0123456789")
        out.append((name, int(token[len(name):][:9] or 0)))  # a forged title cannot make a huge int
    return out
