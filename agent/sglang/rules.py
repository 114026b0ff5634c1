"""SGLang's log rules: small pure functions over an SGLang startup Analysis, each returning zero or
more Findings. The rules every engine shares (unused memory, imbalance, concurrency) and the
live node's rules are in ``agent/model/node_rules.py``; ``agent/model/rulebook.py`` runs them all.

Codes are stable (documented in README); tolerances are named constants.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

from kvforensics.agent.model.citing import and_list, where
from kvforensics.agent.model.records import Finding
from kvforensics.agent.sglang.analysis import Analysis
from kvforensics.agent.sglang.ledger import RankLedger
from kvforensics.agent.sglang.stages import STAGE_WORDS
from kvforensics.collectors.units import gib

GEOMETRY_TOLERANCE = 0.01  # config vs log bytes-per-token, relative


def _min_rank(a: Analysis) -> Optional[RankLedger]:
    known = [r for r in a.ranks if r.target.pre_load_avail_bytes is not None]
    return min(known, key=lambda r: r.target.pre_load_avail_bytes or 0) if known else None


def _ev(r: Optional[RankLedger], *fields: str) -> Tuple[str, ...]:
    if r is None:
        return ()
    out = []
    for f in fields:
        s = r.target.sources.get(f)
        if s:
            out.append("{} {}".format(r.rank or "rank", s) if r.rank else s)
    return tuple(out)


_CAUSE_WORDS = {
    "not_enough_memory": "the KV budget came out at or below zero",
    "no_kv_budget": "the KV budget came out at or below zero",
    "weights_leave_no_memory": "the loaded weights leave no GPU memory for the KV cache",
    "cuda_graph_capture_failed": "CUDA graph capture failed (usually out of the memory left outside the KV pool)",
    "cuda_out_of_memory": "a CUDA allocation ran out of memory",
    "host_memory_short": "the HiCache host pool needs more host RAM than is free",
    "nccl_error": "NCCL (GPU-to-GPU communication) failed",
    "unbalanced_memory": "free memory differs too much across the GPUs (something else holds memory on some)",
    "scheduler_died": "a scheduler process died",
    "child_failed": "a child process failed",
    "exception": "an exception ended it",
    "cuda_error": "a CUDA error (not a memory shortage)",
}


def startup_failed(a: Analysis) -> Iterator[Finding]:
    f = a.failed
    if f is None:
        return
    b = a.budget
    explain = _CAUSE_WORDS.get(f.cause, f.cause)
    stage = STAGE_WORDS.get(f.stage, f.stage)
    detail = "{}: {} ({}{}). Stage: {} (from {}).".format(
        explain, f.message, f.rank + " " if f.rank else "", f.where, stage, f.stage_source)
    if f.cause in ("not_enough_memory", "weights_leave_no_memory", "no_kv_budget") and b.pre_min_bytes \
            and b.post_min_bytes:
        floor = 1 - b.post_min_bytes / b.pre_min_bytes
        detail += (" Post-load free {} against pre-load free {}: any --mem-fraction-static at or below "
                   "{:.4f} leaves rest = post − pre × (1 − f) ≤ 0.").format(
                       gib(b.post_min_bytes), gib(b.pre_min_bytes), floor)
    if f.cause == "no_kv_budget":
        detail += " SGLang profiled {:,} tokens for the pool.".format(f.data["profiled"])
    if f.cause == "host_memory_short":
        detail += " Requested {:.2f} GB, free {:.2f} GB (decimal GB, per rank).".format(
            f.data["requested_bytes"] / 1e9, f.data["free_bytes"] / 1e9)
    free, at = a.last_free_seen()
    proof = "{}{}: {}".format(f.rank + " " if f.rank else "", f.where, f.message)  # the log's words, verbatim
    if free is not None and f.cause not in ("host_memory_short",):
        detail += " The last free figure before it: {} ({}); that memory was not left over, the startup died.".format(
            gib(free), at)
        proof += "; last free figure {} ({})".format(gib(free), at)
    yield Finding(code="startup_failed", severity="critical",
                  title="The startup failed during {}: {}".format(stage, explain), detail=detail, bytes=None,
                  evidence=(f.where,), proof=proof)


def incomplete_startup(a: Analysis) -> Iterator[Finding]:
    """A fragment: say how far it got and what it cannot show, instead of guessing."""
    p = a.progress
    if p.complete or a.failed is not None:
        return
    missing = [STAGE_WORDS[s] for s in p.missing()]
    if p.last_stage is None:
        title = "The log shows no startup stage: it is a fragment"
    else:
        title = "The log stops before the startup finished: the last stage it shows is {} ({})".format(
            STAGE_WORDS[p.last_stage], where(p.last_event))
    free, at = a.last_free_seen()
    seen = " The last free figure, {} ({}), is what was free then, not after startup.".format(gib(free), at) \
        if free is not None else ""
    not_shown = ", ".join(missing) or "the scheduler summary"
    last = "last free figure {} ({}); ".format(gib(free), at) if free is not None else ""
    yield Finding(code="incomplete_startup", severity="info", title=title,
                  detail="Not shown: {}.{} Graph capture, the draft model or a crash may come later, so this report "
                  "makes no unused-memory verdict and recommends no --mem-fraction-static raise. To settle it, include "
                  "the startup from `server_args=` to the `max_total_num_tokens=` summary line, or run `kvforensics "
                  "inspect` on the node.".format(not_shown, seen), bytes=None,
                  evidence=(where(p.last_event),) if p.last_event is not None else (),
                  proof="{}not shown: {}".format(last, not_shown),
                  action="paste the startup from `server_args=` to the `max_total_num_tokens=` line, or run "
                  "`kvforensics inspect` on the node")


def mem_fraction_semantics(a: Analysis) -> Iterator[Finding]:
    b = a.budget
    r = _min_rank(a)
    if b.mfs is None or b.pre_min_bytes is None or b.post_min_bytes is None or r is None:
        return
    pre, post, f = b.pre_min_bytes, b.post_min_bytes, b.mfs
    reserve = b.reserve_bytes or 0
    naive_reserve = post * (1 - f)
    naive_kv = post * f
    kv = r.target.kv_bytes
    detail = ("SGLang reserves (1 − mem_fraction_static) of the free memory measured BEFORE the weights "
              "load: (1 − {f:g}) × {pre} = {res}. The KV pool gets what is left after the weights minus "
              "that reserve: {post} − {res} = {rest}. The naive reading, {f:g} × the {post} left after "
              "the weights = {naive}, would reserve only {nres}.").format(
                  f=f, pre=gib(pre), res=gib(reserve), post=gib(post), rest=gib(post - reserve),
                  naive=gib(naive_kv), nres=gib(naive_reserve))
    if kv is not None:
        detail += " Logged KV pool: {} (naive expectation {}, {} less).".format(
            gib(kv), gib(naive_kv), gib(naive_kv - kv))
    if b.mfs_source.startswith("back-solved"):
        detail += " mem_fraction_static was " + b.mfs_source + "."
    title = "--mem-fraction-static {:g} reserved {} of the {} free before loading, not {} of the {} left after".format(
        f, gib(reserve), gib(pre), gib(naive_reserve), gib(post))
    evidence = _ev(r, "pre_load_avail_bytes", "post_load_avail_bytes", "kv_bytes")
    if a.server_args_source:
        evidence = (a.server_args_source + ": server_args",) + evidence
    proof = "(1 − {:g}) × {} = {} reserve; {} − {} = {} for KV".format(
        f, gib(pre), gib(reserve), gib(post), gib(reserve), gib(post - reserve))
    if kv is not None:
        proof += " (logged {})".format(gib(kv))
    yield Finding(code="mem_fraction_semantics", severity="info", title=title, detail=detail, bytes=reserve,
                  evidence=evidence, proof=proof, mechanism=reserve_mechanism(a, kv))


def reserve_mechanism(a: Analysis, kv: Optional[int]) -> str:
    """Why the KV pool is its size, as SGLang sizes it (model_runner.py profile_max_num_token, every era up
    to 0.5.x): the reserve is (1 − mem_fraction_static) of the free memory measured before the weights
    load, the pool gets what the weights left minus that reserve; then, from a finished startup, what the
    reserve paid for and what of it is still free."""
    b = a.budget
    assert b.mfs is not None and b.pre_min_bytes is not None and b.post_min_bytes is not None
    reserve = b.reserve_bytes or 0
    got = gib(b.post_min_bytes - reserve) if kv is None else "{} (logged)".format(gib(kv))
    solved = b.mfs_source.startswith("back-solved")
    f, rest = ("{:.3f}".format(b.mfs), "{:.3f}".format(1 - b.mfs)) if solved else \
        ("{:g}".format(b.mfs), "{:g}".format(round(1 - b.mfs, 6)))
    head = ("SGLang takes its (1 − {}{}) reserve from the {} free before the weights load: {}, not the {} that "
            "{} of the {} left after them would keep; the KV pool got the rest, {}.").format(
                f, ", back-solved" if solved else "", gib(b.pre_min_bytes), gib(reserve),
                gib(int(b.post_min_bytes * (1 - b.mfs))), rest, gib(b.post_min_bytes), got)
    paid = _paid_for(a)
    return head + (" " + paid if paid else "")


def _paid_for(a: Analysis) -> str:
    """'It paid for the EAGLE3 draft (3.52 GiB), CUDA graphs (1.43 GiB) and workspaces (0.69 GiB); 5.31 GiB
    of it is still free.' from the reserve's breakdown (a finished startup only)."""
    if not a.complete:
        return ""
    groups: Dict[str, int] = {}
    free = None
    algorithm = a.server_args.get("speculative_algorithm")
    draft = "the {} draft".format(algorithm) if isinstance(algorithm, str) and len(algorithm) <= 16 else "the draft"
    for label, n, _ in reserve_breakdown(a):
        if label.startswith("still free"):
            free = n
            continue
        name = draft if "draft" in label else "CUDA graphs" if label.startswith("CUDA graphs") else \
            None if label.startswith("unexplained") else "workspaces"
        if name is not None:
            groups[name] = groups.get(name, 0) + n
    if free is None:
        return ""
    items = ["{} ({})".format(name, gib(n)) for name, n in sorted(groups.items(), key=lambda x: -x[1]) if n > 0]
    spent = "It paid for {}; ".format(and_list(items)) if items else ""
    text = "{}{} of it is still free.".format(spent, gib(free))
    return text[0].upper() + text[1:]



def reserve_breakdown(a: Analysis) -> List[Tuple[str, int, str]]:
    """Where the memory left after the KV pool went, on the rank with the least free memory.

    Returns (item, bytes, source) rows that sum to post-load free − KV − Mamba.
    """
    r = _min_rank(a)
    if r is None:
        return []
    t, d = r.target, r.draft
    post = t.post_load_avail_bytes
    if a.budget.draft_in_budget and d is not None and d.post_load_avail_bytes is not None:
        post = d.post_load_avail_bytes
    if post is None or t.kv_bytes is None or r.final_avail_bytes is None:
        return []
    start = post - t.kv_bytes - (t.mamba_bytes or 0)
    # (label, ledger, field): a row for each item the ledger holds, in the order memory was taken.
    items: List[Tuple[str, Any, str]] = [("req_to_token table", r, "req_to_token_bytes"),
                                         ("attention workspaces", t, "workspace_bytes"),
                                         ("CUDA graphs (target)", t, "graph_bytes")]
    if d is not None:
        if not a.budget.draft_in_budget:
            items += [("draft weights", d, "weights_bytes"), ("draft KV pool", d, "kv_bytes")]
        items += [("draft workspaces", d, "workspace_bytes"), ("CUDA graphs (draft)", d, "graph_bytes")]
    rows: List[Tuple[str, int, str]] = [(label, getattr(led, name), led.sources.get(name, ""))
                                        for label, led, name in items if getattr(led, name)]
    rows.append(("still free after startup", r.final_avail_bytes, r.sources.get("final_avail_bytes", "")))
    rest = start - sum(x[1] for x in rows)
    rows.append(("unexplained (allocator cache, pool metadata, buffers)", rest,
                 "post-load free − KV − items above"))
    return rows


def reserve_spent(a: Analysis) -> Iterator[Finding]:
    if not a.complete:  # "still free after startup" needs a startup that finished
        return
    rows = reserve_breakdown(a)
    if not rows or a.budget.reserve_bytes is None:
        return
    parts = "; ".join("{} {} ({})".format(name, gib(n), src) for name, n, src in rows)
    yield Finding(code="reserve_breakdown", severity="info",
                  title="Where the {} reserve went".format(gib(a.budget.reserve_bytes)), detail=parts + ".",
                  bytes=a.budget.reserve_bytes, evidence=())


def kv_budget_check(a: Analysis) -> Iterator[Finding]:
    b = a.budget
    if b.predicted_tokens is None or b.logged_tokens is None:
        return
    sev = "warning" if b.verdict == "differs" else "info"
    title = "The formula predicts {:,} KV tokens; the log says {:,}: {}".format(
        b.predicted_tokens, b.logged_tokens, "agrees" if b.verdict in ("agrees", "explained") else "differs")
    detail = "; ".join(b.steps) + ". " + b.explanation + ". Bytes per token: {} ({}).".format(
        b.cell_bytes, b.cell_source)
    r = _min_rank(a)
    yield Finding(code="kv_budget_check", severity=sev, title=title, detail=detail,
                  bytes=None if b.cell_bytes is None else abs(b.predicted_tokens - b.logged_tokens) * b.cell_bytes,
                  evidence=_ev(r, "pre_load_avail_bytes", "post_load_avail_bytes", "kv_tokens"))


def draft_in_reserve(a: Analysis) -> Iterator[Finding]:
    r = _min_rank(a)
    if r is None or r.draft is None:
        return
    d = r.draft
    spent = d.total_bytes
    kind = d.model_type or "the draft model"
    if a.budget.draft_in_budget:
        yield Finding(code="draft_in_budget", severity="info",
                      title="The draft model ({}) is inside the KV budget (SGLang 0.5.14+)".format(kind),
                      detail="Its weights ({}) were loaded before the KV pool was sized, and its KV is folded into "
                      "the bytes per token.".format(gib(d.weights_bytes)), bytes=spent, evidence=_ev(r, "kv_bytes"))
        return
    reserve = a.budget.reserve_bytes
    share = " — {:.0f}% of the {} reserve".format(100 * spent / reserve, gib(reserve)) if reserve else ""
    detail = ("SGLang ≤0.5.13 sizes the target KV pool first and then loads the draft runner out of "
              "the (1 − mem_fraction_static) reserve: weights {}, KV {}, workspaces {}, graphs {}{}. "
              "That memory is not available for activations, and the reserve was not enlarged for it.").format(
        gib(d.weights_bytes), gib(d.kv_bytes), gib(d.workspace_bytes), gib(d.graph_bytes), share)
    evidence = tuple(s for s in (d.sources.get("weights_bytes"), d.sources.get("kv_bytes"),
                                 d.sources.get("graph_bytes")) if s)
    yield Finding(code="draft_in_reserve", severity="warning" if reserve and spent > reserve / 4 else "info",
                  title="The draft model ({}) took {} out of the reserve".format(kind, gib(spent)), detail=detail,
                  bytes=spent, evidence=evidence)


def kv_geometry_check(a: Analysis) -> Iterator[Finding]:
    g = a.geometry
    r = _min_rank(a)
    if g is None or r is None or r.target.kv_tokens is None or r.target.kv_bytes is None:
        return
    logged = r.target.kv_bytes / (r.target.kv_tokens + a.page_size)
    diff = abs(logged - g.bytes_per_token) / g.bytes_per_token
    if diff <= GEOMETRY_TOLERANCE:
        yield Finding(code="kv_geometry", severity="info",
                      title="Bytes per token match the model config: {:,} B".format(g.bytes_per_token),
                      detail="{} = {:,} B ({} KV, {}); the log implies {:,.0f} B.".format(
                          g.formula, g.bytes_per_token, g.kind.upper(), g.dtype, logged), bytes=None,
                      evidence=_ev(r, "kv_bytes"))
        return
    yield Finding(code="kv_geometry_mismatch", severity="warning",
                  title="The log's KV pool does not match the model config ({:,.0f} B vs {:,} B per token)".format(
                      logged, g.bytes_per_token),
                  detail="From config: {} ({}). Check --kv-cache-dtype, the TP size, the layer count (PP), or "
                  "whether the right config.json was given.".format(g.formula, g.dtype), bytes=None,
                  evidence=_ev(r, "kv_bytes"))


# SGLang's own adjustments and notes, as findings: event kind → (code, severity, title from the data).
_NOTES = {
    "mfs_adjusted": ("mem_fraction_adjusted", "info", lambda d: "SGLang lowered --mem-fraction-static from {:g} to "
                     "{:g} for the vision tower".format(d["from"], d["to"])),
    "requests_reduced": ("max_running_requests_reduced", "warning", lambda d: "max_running_requests was cut from {} "
                         "to {} by the KV capacity".format(d["requested"], d["effective"])),
    "cap_ignored": ("max_total_tokens_ignored", "info", lambda d: "--max-total-tokens {:,} exceeded the profiled {:,} "
                    "and was ignored".format(d["requested"], d["profiled"])),
    "hicache_host": ("hicache_host_pool", "info", lambda d: "HiCache host pool: {:.2f} GB of host RAM per rank{}"
                     .format(d["host_bytes"] / 1e9, ", {:,} tokens".format(d["tokens"]) if d.get("tokens") else "")),
}


def startup_notes(a: Analysis) -> Iterator[Finding]:
    for ev in a.attributed.other:
        if ev.kind not in _NOTES:
            continue
        code, severity, title = _NOTES[ev.kind]
        if ev.kind == "hicache_host":
            yield Finding(code=code, severity=severity, title=title(ev.data),
                          detail=ev.text + " (decimal GB: HiCache sizes use 1e9)", bytes=ev.data["host_bytes"],
                          evidence=(where(ev),))
        else:
            yield Finding(code=code, severity=severity, title=title(ev.data), detail=ev.text, bytes=None,
                          evidence=(where(ev),))


# SGLang's own log rules, in report order (agent/model/rulebook.py places them among the others).
# What the startup itself came to (failed, or a fragment): reported before everything else.
HEADLINES = (startup_failed, incomplete_startup)
RULES = (mem_fraction_semantics, kv_budget_check, reserve_spent, draft_in_reserve,
         kv_geometry_check, startup_notes)
