"""Build SGLang startup logs in a given era's line formats, for tests and benchmarks."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence


def _args_repr(args: Dict[str, object]) -> str:
    return "ServerArgs(" + ", ".join("{}={!r}".format(k, v) for k, v in args.items()) + ")"


def startup(
    ranks: Sequence[str] = ("TP0", "TP1"),
    args: Optional[Dict[str, object]] = None,
    pre: float = 78.50,
    weights: float = 60.00,
    post: Optional[Dict[str, float]] = None,
    tokens: int = 100000,
    kv_line: str = "KV Cache is allocated. #tokens: {tokens}, K size: {k:.2f} GB, V size: {k:.2f} GB",
    kv_gib: float = 8.00,
    pool_end: float = 9.50,
    graph_begin: float = 9.20,
    graph_used: float = 1.10,
    summary: Optional[str] = "max_total_num_tokens={tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                             "max_running_requests={reqs}, context_len={ctx}, available_gpu_mem={avail:.2f} GB",
    reqs: int = 2048,
    ctx: int = 32768,
    final: float = 7.80,
    date: str = "2025-06-24 10:00:00",
    draft: bool = False,
    fail_after_load: Optional[str] = None,
) -> List[str]:
    """One startup in 0.4.7-0.5.8 formats unless overridden."""
    lines: List[str] = []
    if args is not None:
        lines.append("[{}] server_args={}".format(date, _args_repr(args)))
    post = post or {}
    for r in ranks:
        lines.append("[{} {}] Init torch distributed begin.".format(date, r))
    for r in ranks:
        lines.append("[{} {}] Init torch distributed ends. mem usage=0.80 GB".format(date, r))
        lines.append("[{} {}] Load weight begin. avail mem={:.2f} GB".format(date, r, pre))
    for r in ranks:
        p = post.get(r, pre - weights)
        lines.append("[{} {}] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem={:.2f} GB, "
                     "mem usage={:.2f} GB.".format(date, r, p, pre - p))
    if fail_after_load:
        lines.append("[{} {}] {}".format(date, ranks[0], fail_after_load))
        return lines
    for r in ranks:
        lines.append("[{} {}] {}".format(date, r, kv_line.format(tokens=tokens, k=kv_gib / 2, kv=kv_gib)))
        lines.append("[{} {}] Memory pool end. avail mem={:.2f} GB".format(date, r, pool_end))
        lines.append("[{} {}] Capture cuda graph begin. This can take up to several minutes. avail mem={:.2f} "
                     "GB".format(
            date, r, graph_begin))
        lines.append("[{} {}] Capture cuda graph end. Time elapsed: 20.00 s. mem usage={:.2f} GB. avail mem={:.2f} "
                     "GB.".format(
            date, r, graph_used, graph_begin - graph_used))
    if draft:
        for r in ranks:
            lines.append("[{} {}] Load weight begin. avail mem={:.2f} GB".format(date, r, graph_begin - graph_used))
            lines.append("[{} {}] Load weight end. type=LlamaForCausalLMEagle, dtype=torch.bfloat16, avail mem={:.2f} "
                         "GB, "
                         "mem usage=0.50 GB.".format(date, r, graph_begin - graph_used - 0.5))
            lines.append("[{} {}] KV Cache is allocated. #tokens: {}, K size: 0.05 GB, V size: 0.05 GB".format(date,
                                                                                                               r,
                                                                                                               tokens))
            lines.append("[{} {}] Memory pool end. avail mem={:.2f} GB".format(date, r, graph_begin - graph_used - 0.6))
    if summary:
        lines.append("[{} {}] {}".format(date, ranks[0], summary.format(tokens=tokens, reqs=reqs, ctx=ctx,
                                                                        avail=final)))
    return lines


def noise(n: int, date: str = "2025-06-24 11:00:00") -> List[str]:
    return ["[{} TP0] Decode batch. #running-req: 3, #token: {}, token usage: 0.12, cuda graph: True, "
            "gen throughput (token/s): 100.00, #queue-req: 0".format(date, 1000 + i) for i in range(n)]


def write(path, *parts: Sequence[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for part in parts:
            f.write("\n".join(part) + "\n")
