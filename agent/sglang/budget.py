"""SGLang's KV budget, reproduced for the version era a log shows (research §2–§4).

    rest   = post_load_free_min − pre_load_free_min × (1 − mem_fraction_static)
    tokens = floor(rest / cell_bytes)   (+ speculative headroom ≤0.5.6, cap, page rounding)

``pre_load_free`` is the free memory before weights load (min across ranks), *not* the GPU
capacity and *not* what is left after weights: the reserve is a fraction of the whole
pre-load free memory (the seed case's surprise). Every log figure is printed to 0.01 GiB, so
the prediction is an interval, and "agrees" means the logged #tokens falls inside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from agent.sglang.era import Era
from agent.sglang.ledger import RankLedger
from collectors.sglang.log import GIB, PRINT_TOLERANCE_BYTES

HALF = PRINT_TOLERANCE_BYTES


@dataclass(frozen=True)
class ReqToToken:
    rows: int
    cols: int
    bytes: int
    formula: str


def req_to_token(era: Era, args: Dict[str, Any], tokens: int, context_len: int,
                 running: Optional[int]) -> ReqToToken:
    """The int32 req_to_token table: rows × (context_len + extra) × 4 bytes (research §4, §2.6)."""
    est = max(min(int(tokens / context_len * 512), 4096), 2048)
    user = args.get("max_running_requests")
    if era.at_least((0, 5, 10)) and running is not None:
        rows, why = running, "max_running_requests {} (= pool rows since 0.5.10)".format(running)
    elif isinstance(user, int):
        rows, why = user, "--max-running-requests {}".format(user)
    else:
        rows, why = est, "min(max(int(T/C×512), 2048), 4096) = {}".format(est)
    if era.at_most((0, 4, 6)):
        rows += 1
        why += " + 1 row"
    elif era.at_least((0, 5, 12)):
        rows += 1
        why += " + 1 padding row"
    draft_tokens = args.get("speculative_num_draft_tokens")
    extra = 4
    if era.at_least((0, 5, 1)) and isinstance(draft_tokens, int):
        extra += draft_tokens
    cols = context_len + extra
    return ReqToToken(rows, cols, rows * cols * 4,
                      "{} × (context_len {} + {}) × 4 B".format(why, context_len, extra))


@dataclass(frozen=True)
class Budget:
    """The formula's inputs and its prediction, with sources."""

    mfs: Optional[float]
    mfs_source: str
    pre_min_bytes: Optional[int]
    post_min_bytes: Optional[int]
    post_source: str
    reserve_bytes: Optional[int]
    rest_bytes: Optional[int]
    cell_bytes: Optional[int]
    cell_source: str
    predicted_tokens: Optional[int]
    predicted_low: Optional[int]
    predicted_high: Optional[int]
    logged_tokens: Optional[int]
    verdict: str  # "agrees" | "explained" | "differs" | "back-solved" | "unknown"
    explanation: str
    draft_in_budget: bool  # 0.5.14+: draft weights and KV are inside the static budget
    steps: Tuple[str, ...]


def _min(values: List[Optional[int]]) -> Optional[int]:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def compute(era: Era, args: Dict[str, Any], ranks: Tuple[RankLedger, ...], page_size: int,
            cell_from_config: Optional[int], cell_config_formula: str,
            mm_reserve: int, rows: Optional[int], draft_first: bool,
            mfs_origin: str = "server_args mem_fraction_static", swa_full_tokens: Optional[int] = None) -> Budget:
    """``draft_first``: the draft's weights loaded before the target KV pool was sized (0.5.14+
    order), so the profile saw them and the draft's KV is part of the cell."""
    steps: List[str] = []
    pre = _min([r.target.pre_load_avail_bytes for r in ranks])
    if draft_first:
        post = _min([r.draft.post_load_avail_bytes if r.draft else None for r in ranks])
        post_source = "last 'Load weight end' avail (after the draft's weights; 0.5.14+ profiles then)"
    else:
        post = _min([r.target.post_load_avail_bytes for r in ranks])
        post_source = "'Load weight end' avail"
    logged = next((r.target.kv_tokens for r in ranks if r.target.kv_tokens is not None), None)
    if swa_full_tokens:
        # Hybrid sliding-window pools: the budget is counted in full-attention tokens (each also
        # paying for its share of SWA tokens), and a KV line's #tokens may be the SWA count.
        logged = swa_full_tokens
    mamba = max([r.target.mamba_bytes or 0 for r in ranks] or [0])

    cell, cell_lo, cell_hi, cell_source = _cell(ranks, page_size, draft_first, cell_from_config,
                                                cell_config_formula, swa_full_tokens)
    raw_mfs = args.get("mem_fraction_static")
    mfs = float(raw_mfs) if isinstance(raw_mfs, (int, float)) else None
    mfs_source = mfs_origin if mfs is not None else ""
    empty = Budget(mfs, mfs_source, pre, post, post_source, None, None, cell, cell_source,
                   None, None, None, logged, "unknown", "", draft_first, ())
    if pre is None or post is None:
        return _replace(empty, explanation="the log lacks 'Load weight begin/end' free-memory lines")

    if mfs is None:
        if logged is None or cell is None:
            return _replace(empty, explanation="no server_args line and no KV pool line: "
                            "mem_fraction_static cannot be recovered")
        budget = (logged + page_size) * cell + mamba + mm_reserve
        mfs = 1 - (post - budget) / pre
        lo = 1 - (post + HALF - (logged * (cell_lo or cell))) / (pre - HALF)
        hi = 1 - (post - HALF - ((logged + page_size) * (cell_hi or cell))) / (pre + HALF)
        mfs_source = "back-solved: 1 − (post-load free − KV budget) / pre-load free, {:.4f}–{:.4f}".format(
            min(lo, hi), max(lo, hi))
        reserve = int(pre * (1 - mfs))
        return _replace(empty, mfs=mfs, mfs_source=mfs_source, reserve_bytes=reserve,
                        rest_bytes=post - reserve, verdict="back-solved",
                        explanation="no server_args line: mem_fraction_static ≈ {:.3f} solved from the "
                        "logged pool, so the formula cannot also be checked".format(mfs))

    slack = 1 - mfs
    reserve = int(round(pre * slack))
    rest = post - reserve - mamba - mm_reserve
    steps.append("reserve = pre-load free {:.2f} GiB × (1 − {:g}) = {:.2f} GiB".format(pre / GIB, mfs, reserve / GIB))
    steps.append("rest = post-load free {:.2f} GiB − reserve{} = {:.2f} GiB".format(
        post / GIB, (" − Mamba {:.2f} GiB".format(mamba / GIB) if mamba else "") +
        (" − multimodal {:.2f} GiB".format(mm_reserve / GIB) if mm_reserve else ""), rest / GIB))
    if cell is None:
        return _replace(empty, reserve_bytes=reserve, rest_bytes=rest, steps=tuple(steps),
                        explanation="bytes per token unknown (no KV pool line, no --model-config)")
    rest_lo = (post - HALF) - (pre + HALF) * slack - mamba - mm_reserve
    rest_hi = (post + HALF) - (pre - HALF) * slack - mamba - mm_reserve
    pred = math.floor(rest / cell)
    lo = math.floor(rest_lo / (cell_hi or cell))
    hi = math.floor(rest_hi / (cell_lo or cell))
    steps.append("tokens = floor(rest / {} B per token) = {:,}".format(cell, pred))

    notes: List[str] = []
    algo = args.get("speculative_algorithm")
    if algo not in (None, "None", "NGRAM") and era.at_least((0, 4, 4)) and era.at_most((0, 5, 6)):
        steps_, topk, draft = (args.get("speculative_num_steps"), args.get("speculative_eagle_topk"),
                               args.get("speculative_num_draft_tokens"))
        if all(isinstance(x, int) for x in (steps_, topk, draft)) and rows:
            extra = rows * (steps_ * topk) + rows * draft + 100
            pred, lo, hi = pred + extra, lo + extra, hi + extra
            steps.append("+ speculative headroom {} × ({}×{}) + {} × {} + 100 = {:,} (≤0.5.6)".format(
                rows, steps_, topk, rows, draft, extra))
    cap = args.get("max_total_tokens")
    if isinstance(cap, int) and cap > 0 and cap < pred:
        pred, lo, hi = cap, min(lo, cap), min(hi, cap)
        notes.append("capped by --max-total-tokens {:,}".format(cap))
        steps.append("capped by --max-total-tokens = {:,}".format(cap))
    if page_size > 1:
        pred, lo, hi = (x // page_size * page_size for x in (pred, lo, hi))
        steps.append("rounded down to page_size {} = {:,}".format(page_size, pred))
    result = Budget(mfs, mfs_source, pre, post, post_source, reserve, rest, cell, cell_source,
                    pred, lo, hi, logged, "unknown", "", draft_first, tuple(steps))
    if logged is None:
        return _replace(result, explanation="no 'KV Cache is allocated' line with #tokens to check against")
    if lo <= logged <= hi:
        why = "within print rounding ({:,}–{:,})".format(lo, hi)
        if notes:
            return _replace(result, verdict="explained", explanation="; ".join(notes + [why]))
        return _replace(result, verdict="agrees", explanation=why)
    return _replace(result, verdict="differs", explanation=_differs(logged, lo, hi, cell, ranks))


def _cell(ranks: Tuple[RankLedger, ...], page_size: int, draft_in_budget: bool,
          from_config: Optional[int], config_formula: str, swa_full_tokens: Optional[int] = None
          ) -> Tuple[Optional[int], Optional[float], Optional[float], str]:
    """Bytes per token the budget is divided by, and its uncertainty when taken from the log."""
    for r in ranks:
        t = r.target
        if t.kv_tokens is None or t.kv_bytes is None:
            continue
        if swa_full_tokens:  # every pool's bytes per full-attention token (SGLang 0.5.11+ hybrid SWA)
            rows = swa_full_tokens + page_size
            kv = t.kv_bytes
            half = HALF * 4  # two pool lines, K and V each
            return (int(round(kv / rows)), (kv - half) / rows, (kv + half) / rows,
                    "all KV pools' bytes / (full-attention tokens + page_size) from the log (hybrid SWA)")
        rows = t.kv_tokens + page_size
        kv_bytes = t.kv_bytes
        n_pools = 1
        if draft_in_budget and r.draft is not None and r.draft.kv_bytes is not None:
            kv_bytes += r.draft.kv_bytes
            n_pools += 1
        if from_config is not None:
            if n_pools > 1:  # the draft's share still comes from its logged pool
                draft = r.draft.kv_bytes  # type: ignore[union-attr]
                return (from_config + int(round(draft / rows)), from_config + (draft - HALF) / rows,
                        from_config + (draft + HALF) / rows,
                        "--model-config: {} + the draft's logged KV per token (in the budget since 0.5.14)".format(
                            config_formula))
            return from_config, None, None, "--model-config: " + config_formula
        half = HALF * n_pools
        return (int(round(kv_bytes / rows)), (kv_bytes - half) / rows, (kv_bytes + half) / rows,
                "KV size / (#tokens + page_size) from the log{}".format(
                    " (target + draft pools: the draft is in the budget since 0.5.14)" if n_pools > 1 else ""))
    if from_config is not None:
        return from_config, None, None, "--model-config: " + config_formula
    return None, None, None, ""


def _differs(logged: int, lo: int, hi: int, cell: int, ranks: Tuple[RankLedger, ...]) -> str:
    gap = (lo - logged) if logged < lo else (logged - hi)
    size = gap * cell / GIB
    if logged < lo:
        reasons = ["another rank had less free memory than any shown here (the profile takes the "
                   "minimum across ranks; the log prints each rank's own)"]
        if len(ranks) < 2:
            reasons.append("the log may hold only some of the ranks")
        reasons.append("a multimodal or Mamba reservation not logged by this version")
        return "{:,} tokens ({:.2f} GiB) fewer than the formula allows; possible causes: {}".format(
            gap, size, "; ".join(reasons))
    return ("{:,} tokens ({:.2f} GiB) more than the formula allows: mem_fraction_static may have been "
            "adjusted after server_args was printed (VLM adjustment), or speculative headroom was "
            "added (≤0.5.6)").format(gap, size)


def _replace(b: Budget, **changes: Any) -> Budget:
    from dataclasses import replace

    return replace(b, **changes)
