"""SGLang's processes: which command lines are its servers, schedulers and helpers, and its flags.

The server keeps ``python -m sglang.launch_server …`` / ``sglang serve …``; schedulers are
renamed by setproctitle to ``sglang::scheduler_TP3`` / ``sglang::scheduler_DP1_TP3`` (research
§7.1; a tp=1, dp=1 scheduler is plain ``sglang::scheduler`` since 0.4.7), other children to
``sglang::detokenizer`` and the like. Flags are read the way SGLang's argparse reads them:
aliases and unique prefixes (``--tp 8`` is ``--tp-size 8``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from kvforensics.collectors.argv import parse_flags as _parse

ENGINE = "sglang"

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


def _full(option: str) -> str:
    """argparse's unique-prefix rule over the options we know; unknown options stay as given."""
    if option in _KNOWN:
        return option
    matches = [k for k in _KNOWN if k.startswith(option)]
    return matches[0] if len({_dest(m) for m in matches}) == 1 else option


def _resolve(option: str) -> Optional[str]:
    return _dest(_full(option)) if option.startswith("--") else None


def _is_switch(option: str) -> bool:
    full = _full(option)
    return full.startswith(("--enable-", "--disable-")) or full in _SWITCHES


def parse_flags(argv: List[str]) -> Dict[str, Any]:
    """SGLang server args from a command line (everything after the launch form)."""
    return _parse(argv, _resolve, _is_switch, positional="model_path")  # `sglang serve <model>` (0.5.23)


def classify(argv: List[str]) -> Optional[Dict[str, Any]]:
    """{"role": "server", "launch", "flags_at"} / {"role": "worker", "rank"} / {"role": "helper", "title"}."""
    if not argv:
        return None
    head = argv[0]
    if head.startswith("sglang::scheduler"):
        suffix = head[len("sglang::scheduler"):].strip("_ ")
        return {"role": "worker", "rank": " ".join(t for t in suffix.split("_") if t)}
    if head.startswith("sglang::"):
        return {"role": "helper", "title": head}
    for i, token in enumerate(argv[:4]):
        if token == "sglang.launch_server" or token.endswith("/sglang/launch_server.py"):
            return {"role": "server", "launch": "launch_server", "flags_at": i + 1}
        if token.rsplit("/", 1)[-1] == "sglang" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return {"role": "server", "launch": "serve", "flags_at": i + 2}
    return None
