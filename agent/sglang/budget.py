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

from kvforensics.agent.sglang.era import Era
from kvforensics.agent.sglang.ledger import RankLedger
from kvforensics.collectors.lineformat import Version
from kvforensics.collectors.sglang.log import GIB, PRINT_TOLERANCE_BYTES

HALF = PRINT_TOLERANCE_BYTES


# Budget rule boundaries, from the release wheels (sglang_source_facts §1–§6). Version tuples here
# carry no ".postN": 0.4.3.post4 counts as 0.4.4 and 0.4.6.post5 as 0.4.7, as the line-shape clues do.
HEADROOM = ((0, 4, 4), (0, 5, 6))  # EAGLE headroom added to the target pool (0.4.3.post4–0.5.6.post2)
DRAFT_IN_BUDGET = (0, 5, 14)  # draft weights before profiling; cell × (1 + draft layers / target layers)
BOUNDARIES = ((0, 3, 1), (0, 3, 2), (0, 4, 2), (0, 4, 4), (0, 4, 7), (0, 5, 1), (0, 5, 7), (0, 5, 10), (0, 5, 11),
              (0, 5, 14), (0, 5, 16), (0, 5, 17))
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "MTP")  # NEXTN/MTP run as EAGLE in SGLang
MAX_DRAFT_LAYERS = 4  # draft depths tried when the draft's config is not at hand


def default_max_num_reqs(era: Era, tokens: int, context_len: int) -> int:
    """SGLang's default max_num_reqs: min(max(int(T / C × 512), 2048), cap); cap 5120 up to 0.3.0,
    4096 since (model_runner.py init_memory_pool; 0.5.10+ _resolve_max_num_reqs also ≤ T // 2)."""
    cap = 5120 if era.at_most((0, 3, 0)) else 4096
    est = min(max(int(tokens / max(1, context_len) * 512), 2048), cap)
    return min(est, max(1, tokens // 2)) if era.at_least((0, 5, 10)) else est


@dataclass(frozen=True)
class ReqToToken:
    """SGLang's int32 req_to_token table (rows × cols × 4 bytes), which no log line reports, with its formula."""

    rows: int
    cols: int
    bytes: int
    formula: str


def req_to_token(era: Era, args: Dict[str, Any], tokens: int, context_len: int,
                 running: Optional[int], profiled: Optional[int] = None) -> ReqToToken:
    """The int32 req_to_token table, rows × cols × 4 bytes (ReqToTokenPool.__init__; its caller per
    release, sglang_source_facts §4). Rows: R up to 0.3.1, R + 1 in 0.3.2–0.4.6.post5, R in
    0.4.7–0.5.10, R + 1 (a padding row) from 0.5.11. R: --max-running-requests, else the default
    from the capped T (≤0.4.1), the profiled uncapped T (0.4.2–0.5.9), or the resolved value the
    summary prints (0.5.10+). Columns: context_len + 8 up to 0.3.1, + 4 since, + the speculative
    draft tokens from 0.5.1. No log line reports this table."""
    user = args.get("max_running_requests")
    if era.at_least((0, 5, 10)) and running is not None:
        r, why = running, "max_running_requests {} (resolved, as the summary prints it; 0.5.10+)".format(running)
    elif isinstance(user, int) and user > 0:
        r, why = user, "--max-running-requests {}".format(user)
    else:
        basis = profiled if (profiled and era.at_least((0, 4, 2))) else tokens
        r = default_max_num_reqs(era, basis, context_len)
        why = "min(max(int(T/C×512), 2048), {}) with T = {:,} ({}) = {}".format(
            5120 if era.at_most((0, 3, 0)) else 4096, basis,
            "profiled, uncapped" if basis is profiled else "max_total_num_tokens", r)
    rows = r
    if era.at_least((0, 3, 2)) and era.at_most((0, 4, 6)):
        rows, why = r + 1, why + " + 1 row (0.3.2–0.4.6)"
    elif era.at_least((0, 5, 11)):
        rows, why = r + 1, why + " + 1 padding row (0.5.11+)"
    extra = 8 if era.at_most((0, 3, 1)) else 4
    draft_tokens = args.get("speculative_num_draft_tokens")
    if era.at_least((0, 5, 1)) and isinstance(draft_tokens, int):
        extra += draft_tokens
    cols = context_len + extra
    return ReqToToken(rows=rows, cols=cols, bytes=rows * cols * 4,
                      formula="{} × (context_len {} + {}) × 4 B".format(why, context_len, extra))


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
    era_hint: str = ""  # the releases whose rules this prediction used
    profiled_tokens: Optional[int] = None  # before headroom, cap and page rounding


@dataclass(frozen=True)
class Inputs:
    """What the formula reads from a startup, independent of the release rules applied to it."""

    args: Dict[str, Any]
    ranks: Tuple[RankLedger, ...]
    page_size: int
    cell_from_config: Optional[int] = None
    cell_config_formula: str = ""
    mm_reserve: int = 0
    draft_first: bool = False  # draft weights loaded before the target pool was sized (0.5.14+ order)
    mfs_origin: str = "server_args mem_fraction_static"
    swa_full_tokens: Optional[int] = None
    context_len: Optional[int] = None
    target_layers: Optional[int] = None  # from --model-config or an MLA pool line: the 0.5.14+ draft scaling needs it
    logged_tokens: Optional[int] = None  # the first (pre-capture) KV line's #tokens
    summary_tokens: Optional[int] = None  # max_total_num_tokens: the count when no KV line gives one (≤0.4.3)
    # 0.5.16+ post-capture sizing: (#tokens, bytes) of the pre-capture pool lines ('VA upper bound': the whole
    # tensors, before the 2 MiB round-up of what is backed), the figures the bytes per token come from.
    pre_capture_kv: Optional[Tuple[int, int]] = None


def mem_fraction_change(b: Budget, delta_bytes: int) -> Tuple[float, int, int]:
    """(new --mem-fraction-static, KV bytes gained, KV tokens gained) for moving the KV budget by
    at most ``delta_bytes`` (negative: give memory back).

    The budget moves by Δf × pre-load free (min over ranks). The value is rounded down to 3
    decimals (the precision SGLang's own defaults use), so a raise never exceeds the spare memory
    and the gain is Δf × pre-load free for the rounded Δf, a little under the spare: this is the
    one place that rounding happens, and ``MFS_ROUNDING`` is the one sentence that says so.
    """
    assert b.mfs is not None and b.pre_min_bytes and b.cell_bytes
    new = math.floor((b.mfs + delta_bytes / b.pre_min_bytes) * 1000) / 1000
    gain = int((new - b.mfs) * b.pre_min_bytes)
    tokens = gain // b.cell_bytes if gain >= 0 else -((-gain) // b.cell_bytes)
    return new, gain, tokens


MFS_ROUNDING = ("--mem-fraction-static is rounded down to 3 decimals, so the KV pool grows by a little less than "
                "the spare, never more")


def _min(values: List[Optional[int]]) -> Optional[int]:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def split(era: Era) -> List[Era]:
    """The era cut at every budget-rule boundary inside it (one piece when none falls inside)."""
    pieces, low = [], era.low
    for b in BOUNDARIES:
        if low < b <= era.high:
            pieces.append(Era(low, _before(b), era.clues))
            low = b
    pieces.append(Era(low, era.high, era.clues))
    return pieces


def _before(v: Version) -> Version:
    """The last release before ``v`` that the version tuples can name (0.5.7 → 0.5.6)."""
    return (v[0], v[1], v[2] - 1) if v[2] > 0 else (v[0], v[1] - 1, 99)


def compute(era: Era, inputs: Inputs) -> Budget:
    """The prediction under the rules of the releases the log's line formats allow. When that
    range straddles a rule boundary, each side is computed; the log's own pool says which fits."""
    results = [(piece, _compute_one(piece, inputs)) for piece in split(era)]
    distinct = {r.predicted_tokens for _, r in results}
    if len(distinct) <= 1:
        return results[0][1]
    fits = [(p, r) for p, r in results if r.verdict in ("agrees", "explained")]
    piece, chosen = fits[0] if fits else results[0]
    others = "; ".join("{}: {:,}".format(p.hint, r.predicted_tokens) for p, r in results
                       if r.predicted_tokens is not None)
    if fits:
        note = "the line formats allow {}, whose budget rules differ ({}); the logged pool fits {}".format(
            era.hint, others, piece.hint)
    else:
        note = "the line formats allow {}, whose budget rules differ ({}); the logged pool fits none".format(
            era.hint, others)
    return _replace(chosen, explanation="; ".join(x for x in (chosen.explanation, note) if x),
                    era_hint=piece.hint)


def _compute_one(era: Era, inputs: Inputs) -> Budget:
    """The budget under one era's rules: the formula forward from mem_fraction_static, or, without
    server_args, the fraction back-solved from the logged pool."""
    cell, cell_lo, cell_hi, cell_source = _cell(inputs.ranks, inputs.page_size, inputs.draft_first,
                                                inputs.cell_from_config, inputs.cell_config_formula,
                                                inputs.swa_full_tokens, inputs.summary_tokens, inputs.pre_capture_kv)
    empty = _unpredicted(era, inputs, cell, cell_source)
    pre, post = empty.pre_min_bytes, empty.post_min_bytes
    if pre is None or post is None or pre <= 0:
        return _replace(empty, explanation="the log lacks 'Load weight begin/end' free-memory lines")
    if empty.mfs is None:
        return _back_solved(empty, inputs, cell_lo, cell_hi)
    return _predicted(era, inputs, empty, (cell, cell_lo or cell, cell_hi or cell))


def _unpredicted(era: Era, inputs: Inputs, cell: Optional[int], cell_source: str) -> Budget:
    """The formula's inputs as the startup gives them, before any rule is applied."""
    post, post_source = _post_load_free(inputs)
    mfs = _mem_fraction(inputs.args)
    return Budget(mfs=mfs, mfs_source=inputs.mfs_origin if mfs is not None else "",
                  pre_min_bytes=_min([r.target.pre_load_avail_bytes for r in inputs.ranks]), post_min_bytes=post,
                  post_source=post_source, reserve_bytes=None, rest_bytes=None, cell_bytes=cell,
                  cell_source=cell_source, predicted_tokens=None, predicted_low=None, predicted_high=None,
                  logged_tokens=_logged_tokens(inputs), verdict="unknown", explanation="",
                  draft_in_budget=inputs.draft_first, steps=(), era_hint=era.hint)


def _post_load_free(inputs: Inputs) -> Tuple[Optional[int], str]:
    """(the least free memory after the weights load, which line it is): 0.5.14+ profiles after the
    draft's weights, so then the draft's line."""
    if inputs.draft_first:
        return (_min([r.draft.post_load_avail_bytes if r.draft else None for r in inputs.ranks]),
                "last 'Load weight end' avail (after the draft's weights; 0.5.14+ profiles then)")
    return _min([r.target.post_load_avail_bytes for r in inputs.ranks]), "'Load weight end' avail"


def _logged_tokens(inputs: Inputs) -> Optional[int]:
    """The pool's #tokens the prediction is checked against."""
    if inputs.swa_full_tokens:
        # Hybrid sliding-window pools: the budget is counted in full-attention tokens (each also
        # paying for its share of SWA tokens), and a KV line's #tokens may be the SWA count.
        return inputs.swa_full_tokens
    if inputs.logged_tokens is not None:
        return inputs.logged_tokens
    return next((r.target.kv_tokens for r in inputs.ranks if r.target.kv_tokens is not None), inputs.summary_tokens)


def _mem_fraction(args: Dict[str, Any]) -> Optional[float]:
    """--mem-fraction-static from server_args, when it is a fraction in (0, 1]."""
    raw = args.get("mem_fraction_static")
    return float(raw) if isinstance(raw, (int, float)) and 0 < raw <= 1 else None


def _mamba_bytes(ranks: Tuple[RankLedger, ...]) -> int:
    return max([r.target.mamba_bytes or 0 for r in ranks] or [0])


def _back_solved(empty: Budget, inputs: Inputs, cell_lo: Optional[float], cell_hi: Optional[float]) -> Budget:
    """Without server_args: the mem_fraction_static the logged pool implies (then the formula
    itself cannot be checked)."""
    pre, post, cell, logged = empty.pre_min_bytes, empty.post_min_bytes, empty.cell_bytes, empty.logged_tokens
    assert pre is not None and post is not None
    if logged is None or cell is None:
        return _replace(empty, explanation="no server_args line and no KV pool line: "
                        "mem_fraction_static cannot be recovered")
    page_size = inputs.page_size
    budget = (logged + page_size) * cell + _mamba_bytes(inputs.ranks) + inputs.mm_reserve
    mfs = 1 - (post - budget) / pre
    if not 0 < mfs <= 1 or pre <= HALF:
        return _replace(empty, explanation="no server_args line, and the fraction the logged pool implies "
                        "({:.3f}) is outside (0, 1]: the log's free-memory and pool figures do not fit "
                        "together".format(mfs))
    # The interval the print rounding of every figure allows.
    lo = 1 - (post + HALF - (logged * (cell_lo or cell))) / (pre - HALF)
    hi = 1 - (post - HALF - ((logged + page_size) * (cell_hi or cell))) / (pre + HALF)
    mfs_source = "back-solved: 1 − (post-load free − KV budget) / pre-load free, {:.4f}–{:.4f}".format(
        min(lo, hi), max(lo, hi))
    reserve = int(pre * (1 - mfs))
    return _replace(empty, mfs=mfs, mfs_source=mfs_source, reserve_bytes=reserve,
                    rest_bytes=post - reserve, verdict="back-solved",
                    explanation="no server_args line: mem_fraction_static ≈ {:.3f} solved from the "
                    "logged pool, so the formula cannot also be checked".format(mfs))


def _predicted(era: Era, inputs: Inputs, empty: Budget, cells: Tuple[Any, Any, Any]) -> Budget:
    """The formula forward from a known mem_fraction_static: the reserve, the rest, the tokens it
    holds (an interval: every figure is printed to 0.01 GiB), then the release's adjustments."""
    pre, post, mfs, logged = empty.pre_min_bytes, empty.post_min_bytes, empty.mfs, empty.logged_tokens
    assert pre is not None and post is not None and mfs is not None
    mamba, mm_reserve = _mamba_bytes(inputs.ranks), inputs.mm_reserve
    steps: List[str] = []
    slack = 1 - mfs
    reserve = int(round(pre * slack))
    rest = post - reserve - mamba - mm_reserve
    steps.append("reserve = pre-load free {:.2f} GiB × (1 − {:g}) = {:.2f} GiB".format(pre / GIB, mfs, reserve / GIB))
    steps.append("rest = post-load free {:.2f} GiB − reserve{} = {:.2f} GiB".format(
        post / GIB, _set_aside_terms(mamba, mm_reserve), rest / GIB))
    if empty.cell_bytes is None:
        return _replace(empty, reserve_bytes=reserve, rest_bytes=rest, steps=tuple(steps),
                        explanation="bytes per token unknown (no KV pool line, no --model-config)")
    rest_lo = (post - HALF) - (pre + HALF) * slack - mamba - mm_reserve
    rest_hi = (post + HALF) - (pre - HALF) * slack - mamba - mm_reserve
    if inputs.draft_first and era.at_least(DRAFT_IN_BUDGET):
        scaled = _draft_scaled_cell(cells, rest_lo, rest_hi, logged, inputs.target_layers, steps)
        if scaled is None:
            return _replace(empty, reserve_bytes=reserve, rest_bytes=rest, steps=tuple(steps), explanation=(
                "0.5.14+ divides by the target's bytes per token × (1 + draft layers / target layers); the "
                "target's layer count is missing: pass --model-config (in the log only an MLA pool line with "
                "dtype and #tokens gives it){}".format(
                    _implied_draft_ratio(rest, logged, empty.cell_bytes))))
        cells = scaled
    cell_mid, cell_lo, cell_hi = cells
    profiled = math.floor(rest / cell_mid)
    steps.append("tokens = floor(rest / {} B per token) = {:,}".format(cell_mid, profiled))
    (pred, lo, hi), notes = _pool_adjustments(era, inputs, (profiled, math.floor(rest_lo / cell_hi),
                                                            math.floor(rest_hi / cell_lo)), steps)
    result = _replace(empty, reserve_bytes=reserve, rest_bytes=rest, cell_bytes=cell_mid, predicted_tokens=pred,
                      predicted_low=lo, predicted_high=hi, steps=tuple(steps), profiled_tokens=profiled)
    return _judged(result, notes, inputs.ranks)


def _set_aside_terms(mamba: int, mm_reserve: int) -> str:
    """The step's text for what comes off the rest besides the reserve."""
    return ((" − Mamba {:.2f} GiB".format(mamba / GIB) if mamba else "")
            + (" − multimodal {:.2f} GiB".format(mm_reserve / GIB) if mm_reserve else ""))


def _implied_draft_ratio(rest: int, logged: Optional[int], cell: int) -> str:
    """The draft scaling the logged pool implies, quoted when the target's layer count is unknown."""
    if not logged or rest / logged <= cell:
        return ""
    return " (the log implies ≈ 1 + 1/{:.1f})".format(1 / max(1e-9, rest / logged / cell - 1))


def _pool_adjustments(era: Era, inputs: Inputs, profiled: Tuple[int, int, int],
                      steps: List[str]) -> Tuple[Tuple[int, int, int], List[str]]:
    """(tokens, low, high) after what SGLang does to the profiled count: the speculative headroom
    (0.4.4–0.5.6), the --max-total-tokens cap, the page rounding; and the notes that explain a
    logged pool off the plain formula."""
    pred, lo, hi = profiled
    notes: List[str] = []
    extra = _eagle_headroom(era, inputs.args, pred, inputs.context_len, steps)
    if extra:
        pred, lo, hi = pred + extra, lo + extra, hi + extra
    cap = inputs.args.get("max_total_tokens")
    if isinstance(cap, int) and cap > 0 and cap < pred:
        pred, lo, hi = cap, min(lo, cap), min(hi, cap)
        notes.append("capped by --max-total-tokens {:,}".format(cap))
        steps.append("capped by --max-total-tokens = {:,}".format(cap))
    page_size = inputs.page_size
    if page_size > 1:
        pred, lo, hi = (x // page_size * page_size for x in (pred, lo, hi))
        steps.append("rounded down to page_size {} = {:,}".format(page_size, pred))
    return (pred, lo, hi), notes


def _judged(result: Budget, notes: List[str], ranks: Tuple[RankLedger, ...]) -> Budget:
    """The verdict: the logged pool inside the predicted interval agrees (or is explained, when an
    adjustment was needed); outside it, the likely reasons."""
    logged, lo, hi = result.logged_tokens, result.predicted_low, result.predicted_high
    assert lo is not None and hi is not None and result.cell_bytes is not None
    if logged is None:
        return _replace(result, explanation="no 'KV Cache is allocated' line with #tokens to check against")
    if lo <= logged <= hi:
        why = "within print rounding ({:,}–{:,})".format(lo, hi)
        if notes:
            return _replace(result, verdict="explained", explanation="; ".join(notes + [why]))
        return _replace(result, verdict="agrees", explanation=why)
    return _replace(result, verdict="differs", explanation=_differs(logged, lo, hi, result.cell_bytes, ranks))


GRANULE = 2 << 20  # CUDA VMM allocation granularity the KV arena backs in (cuda_vmm_utils.get_device_granularity)


@dataclass(frozen=True)
class Resized:
    """The 0.5.16+ post-capture line's figures."""

    tokens: int
    kv_bytes: Optional[int]  # what is backed: each buffer's span rounded up to the 2 MiB granule
    avail_bytes: Optional[int]
    source: str
    free_before_bytes: Optional[int] = None  # the last 'Capture … end' avail before the re-size
    backed_before_bytes: Optional[int] = None  # one page per buffer, each rounded up to 2 MiB (needs the layers)


def post_capture_check(b: Budget, resized: Resized, mm_reserve: int, page_size: int = 1) -> Budget:
    """0.5.16+ (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING; never for MLA): after CUDA-graph capture SGLang
    re-sizes the pool from the memory then free: budget = int(max(0, free − pre × (1 − f) [− multimodal])
    × 2^30) + the bytes backed before capture (one page per buffer, rounded up to the 2 MiB granule),
    T = budget // cell capped at the pre-capture count; then it backs each buffer to (T + page) rows
    rounded up to 2 MiB (kv_pool_runtime.py compute_post_capture_kv_resize, kv_vmm_backing.py
    KvVmmBufferOwner._back_spans/finalize, sglang 0.5.18). So unless the cap binds, what stays free is
    the reserve less the padding page and less the round-up, which the line's own KV size shows:
    KV size − (T + page) × cell. The bytes backed before capture are paid before and counted back in the
    budget, so they cancel here."""
    pre_capture = b.logged_tokens
    step = "after capture the pool was re-sized to {:,} tokens ({})".format(resized.tokens, resized.source)
    if b.reserve_bytes is None:
        return _replace(b, steps=b.steps + (step,))
    if pre_capture is not None and resized.tokens >= pre_capture:
        note = "post-capture re-sizing kept the pre-capture count {:,} (its cap)".format(pre_capture)
    elif resized.avail_bytes is None:
        note = "post-capture re-sizing to {:,} tokens: the line gives no free figure to check it".format(
            resized.tokens)
    else:
        note = _post_capture_note(b, resized, mm_reserve, page_size)
    count = _post_capture_count(b, resized, mm_reserve, page_size)
    return _replace(b, steps=b.steps + (step,), explanation="; ".join(x for x in (b.explanation, note, count) if x))


def _post_capture_count(b: Budget, resized: Resized, mm_reserve: int, page_size: int) -> str:
    """The re-sized count itself, when the free memory after capture and the bytes backed before it are
    known: min(floor((free − reserve [− multimodal] + backed before) / cell), pre-capture count), page-
    aligned. SGLang keeps a larger headroom when the decode graphs' max batch is below
    max_running_requests (or for Mamba models), so a count below the interval is named, not warned."""
    free, backed, cell = resized.free_before_bytes, resized.backed_before_bytes, b.cell_bytes
    if free is None or backed is None or not cell or b.reserve_bytes is None or b.logged_tokens is None:
        return ""
    if resized.tokens >= b.logged_tokens:
        return ""
    lo, hi = (int(max(0, f - b.reserve_bytes - mm_reserve) + backed) // cell // page_size * page_size
              for f in (free - 2 * HALF, free + 2 * HALF))
    lo, hi = min(lo, b.logged_tokens), min(hi, b.logged_tokens)
    what = ("re-sized count {:,}: (free after capture {:.2f} GiB − reserve + {} MiB backed before capture) / {:,} "
            "B per token allows {:,}–{:,}").format(resized.tokens, free / GIB, backed >> 20, cell, lo, hi)
    if lo <= resized.tokens <= hi:
        return what + ": agrees"
    return what + (" (SGLang keeps a larger headroom when the decode CUDA graphs' max batch is below "
                   "max_running_requests)" if resized.tokens < lo else "")


def _post_capture_note(b: Budget, resized: Resized, mm_reserve: int, page_size: int) -> str:
    """The free memory after the re-size against the reserve, less the padding page and the round-up."""
    assert b.reserve_bytes is not None and resized.avail_bytes is not None
    cell = b.cell_bytes or 0
    pad = page_size * cell
    roundup = max(0, resized.kv_bytes - (resized.tokens + page_size) * cell) if resized.kv_bytes and cell else 0
    expected = b.reserve_bytes + mm_reserve - pad - roundup
    slack = cell * max(64, page_size) + 3 * HALF  # a page of tokens and the print rounding
    gap = resized.avail_bytes - expected
    kept = "the reserve {:.2f} GiB{}".format((b.reserve_bytes + mm_reserve) / GIB, (
        " less {:.2f} GiB rounded up to 2 MiB granules".format(roundup / GIB) if roundup > HALF else ""))
    if -slack <= gap <= slack + pad:
        return "post-capture re-sizing left {:.2f} GiB free, {}: agrees".format(resized.avail_bytes / GIB, kept)
    return "post-capture re-sizing left {:.2f} GiB free where SGLang keeps {} ({:+.2f} GiB)".format(
        resized.avail_bytes / GIB, kept, gap / GIB)


def _eagle_headroom(era: Era, args: Dict[str, Any], profiled: int, context_len: Optional[int],
                    steps: List[str]) -> int:
    """0.4.3.post4–0.5.6: an EAGLE-family target pool holds R × steps × topk + R × draft tokens + 100
    more than profiled, before the cap and page rounding (model_runner.py init_memory_pool); R is
    --max-running-requests, else the default from the profiled T. 0.4.2–0.4.3 grew only the draft's
    pool; 0.5.7+ adds nothing."""
    if str(args.get("speculative_algorithm")).upper() not in EAGLE_FAMILY:
        return 0
    if not (era.at_least(HEADROOM[0]) and era.at_most(HEADROOM[1])):
        return 0
    n_steps, topk, draft = (args.get("speculative_num_steps"), args.get("speculative_eagle_topk"),
                            args.get("speculative_num_draft_tokens"))
    if not all(isinstance(x, int) and x >= 0 for x in (n_steps, topk, draft)):
        steps.append("speculative headroom (0.4.4–0.5.6) unknown: server_args lacks the speculative step counts")
        return 0
    user = args.get("max_running_requests")
    if isinstance(user, int) and user > 0:
        r, why = user, "--max-running-requests"
    elif context_len:
        r, why = default_max_num_reqs(era, profiled, context_len), "default max_num_reqs"
    else:
        steps.append("speculative headroom (0.4.4–0.5.6) unknown: no context_len for the default max_num_reqs")
        return 0
    extra = r * n_steps * topk + r * draft + 100
    steps.append("+ speculative headroom {} ({}) × {} steps × topk {} + {} × {} draft tokens + 100 = {:,} "
                 "(0.4.4–0.5.6)".format(r, why, n_steps, topk, r, draft, extra))
    return extra


def _draft_scaled_cell(cells: Tuple[float, float, float], rest_lo: float, rest_hi: float, logged: Optional[int],
                       target_layers: Optional[int], steps: List[str]) -> Optional[Tuple[int, float, float]]:
    """0.5.14+: bytes per token = int(target cell × (1 + draft layers / target layers))
    (pool_configurator.py DefaultPoolConfigurator.__init__), whatever the draft's own geometry (an
    MHA EAGLE-3 draft of an MLA target is budgeted at the target's per-layer size). The draft's
    layer count is tried from 1 to MAX_DRAFT_LAYERS; the one the logged pool fits is reported."""
    if not target_layers:
        return None
    cell, cell_lo, cell_hi = cells
    best = None
    for d in range(1, MAX_DRAFT_LAYERS + 1):
        scale = 1 + d / target_layers
        mid, lo, hi = int(cell * scale), cell_lo * scale, cell_hi * scale
        fits = logged is not None and math.floor(rest_lo / hi) <= logged <= math.floor(rest_hi / lo)
        if best is None or fits:
            best = (d, (mid, lo, hi))
        if fits:
            break
    assert best is not None
    d, scaled = best
    steps.append("bytes per token = int({} × (1 + {} draft layer(s) / {} target layers)) = {} (0.5.14+: the draft's "
                 "KV is budgeted at the target's per-layer size)".format(int(cell), d, target_layers, scaled[0]))
    return scaled


def _cell(ranks: Tuple[RankLedger, ...], page_size: int, draft_in_budget: bool,
          from_config: Optional[int], config_formula: str, swa_full_tokens: Optional[int] = None,
          summary_tokens: Optional[int] = None, pre_capture: Optional[Tuple[int, int]] = None
          ) -> Tuple[Optional[int], Optional[float], Optional[float], str]:
    """The target's bytes per token, and its uncertainty when taken from the log (the pool has
    #tokens + page_size rows, memory_pool.py). The 0.5.14+ draft scaling is applied by the caller."""
    if from_config is not None and from_config > 0:
        return from_config, None, None, config_formula
    if pre_capture is not None and not swa_full_tokens and pre_capture[1] - HALF > 0 \
            and pre_capture[1] >= pre_capture[0] + page_size:
        tokens, kv = pre_capture
        rows = tokens + page_size
        return (int(round(kv / rows)), (kv - HALF) / rows, (kv + HALF) / rows,
                "the pre-capture 'KV Cache VA upper bound' size / (#tokens + page_size) from the log (the "
                "post-capture size is rounded up to 2 MiB per buffer)")
    for r in ranks:
        t = r.target
        if t.kv_bytes is None or (t.kv_tokens is None and not summary_tokens):
            continue
        if t.kv_tokens is None:
            if t.kv_bytes - HALF <= 0 or t.kv_bytes < (summary_tokens or 0) + page_size:
                continue  # the print rounding could make it 0 bytes per token: nothing to divide by
            return _cell_from_summary(t.kv_bytes, summary_tokens or 0, page_size)
        # Hybrid sliding-window pools (SGLang 0.5.11+): every pool's bytes per full-attention token, from
        # two pool lines (K and V), each printed to ±HALF.
        rows, half = (swa_full_tokens + page_size, HALF * 4) if swa_full_tokens else (t.kv_tokens + page_size, HALF)
        kv = t.kv_bytes
        if kv - half <= 0 or kv < rows:  # the print rounding could make it 0 bytes per token: nothing to divide by
            continue
        return (int(round(kv / rows)), (kv - half) / rows, (kv + half) / rows,
                "all KV pools' bytes / (full-attention tokens + page_size) from the log (hybrid SWA)"
                if swa_full_tokens else "the target's KV size / (#tokens + page_size) from the log")
    return None, None, None, ""


def _cell_from_summary(kv_bytes: int, tokens: int, page_size: int) -> Tuple[int, float, float, str]:
    """0.4.2–0.4.3 print 'KV Cache is allocated. K size: …, V size: …' without #tokens
    (MHATokenToKVPool.__init__, memory_pool.py, sglang 0.4.2); the pool holds max_total_num_tokens
    (the scheduler's summary) + 1 padding row."""
    rows = tokens + page_size
    return (int(round(kv_bytes / rows)), (kv_bytes - HALF) / rows, (kv_bytes + HALF) / rows,
            "the target's KV size / (max_total_num_tokens + page_size) from the log (the KV line has no #tokens)")


def _differs(logged: int, lo: int, hi: int, cell: int, ranks: Tuple[RankLedger, ...]) -> str:
    gap = (lo - logged) if logged < lo else (logged - hi)
    size = min(gap * cell, GIB << 40) / GIB  # capped at 2^70 B: a forged pool's gap may not fit in a float
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
