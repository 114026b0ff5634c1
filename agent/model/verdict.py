"""The answer first: a report's verdict, derived from the findings and recommendations already made.

Engine-neutral. It reads the engine's analysis through the protocol ``agent/model/node_rules.py``
describes (``failed``, ``complete``, ``summary.max_total_num_tokens``, ``ranks[].target.kv_bytes``)
and chooses, in this order:

* the cause: the startup's headline (failed, or a fragment), else what breaks the node (a
  critical or error finding: a lost GPU, leaked memory), else the explanation of the KV size
  (``mem_fraction_semantics``; vLLM's ``gpu_memory_utilization_semantics``), else the most severe finding;
* the action: what the cause says to do first (a finding's ``action``: reset a lost GPU, paste
  the whole startup), else the first recommendation (recommenders are ordered best first: a
  failed startup's fix, a raise into unused memory, …), else nothing worth a restart.

The verdict's words are the findings' own; only the question is written here.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from agent.model.records import Finding, Recommendation, Verdict, severity_rank
from collectors.units import GIB, gib

HEADLINES = ("startup_failed", "incomplete_startup")
KV_EXPLANATIONS = ("mem_fraction_semantics", "gpu_memory_utilization_semantics")
NO_ACTION = "none: no flag change gains enough to be worth a restart"
NO_ENGINE_ACTION = "none: without the engine's startup log there is no flag to size"


def verdict(analysis: Optional[Any], live: bool, findings: Sequence[Finding],
            recommendations: Sequence[Recommendation]) -> Verdict:
    key = key_finding(findings)
    action, index = best_action(key, recommendations)
    if action == NO_ACTION and analysis is None:
        action = NO_ENGINE_ACTION
    if key is None:
        return Verdict(question=question(analysis, live), cause="nothing to report: no finding", proof="",
                       action=action, cause_finding=None, action_recommendation=index)
    return Verdict(question=question(analysis, live), cause=_sentence(key.title),
                   proof=key.proof or _first_sentence(key.detail), action=action, cause_finding=key.code,
                   action_recommendation=index)


def question(analysis: Optional[Any], live: bool) -> str:
    """The on-call question this report answers, with the figure that prompted it."""
    where = "Where did the GPU memory go?"
    if analysis is None:
        return where
    if analysis.failed is not None:
        return "Why did the startup fail?"
    if not analysis.complete:
        return "How far did this startup get, and what can this log show?"
    kv = _kv_per_rank(analysis)
    if kv is None:
        return where
    tokens = analysis.summary.max_total_num_tokens
    why = "Why is the KV cache {} per rank{}?".format(
        gib(kv), " ({:,} tokens)".format(tokens) if tokens and not live else "")
    return "{} {}".format(where, why) if live else why


def key_finding(findings: Sequence[Finding]) -> Optional[Finding]:
    if not findings:
        return None
    if findings[0].code in HEADLINES:  # the rule book puts the headline first
        return findings[0]
    worst = max(findings, key=lambda f: severity_rank(f.severity))
    if severity_rank(worst.severity) >= severity_rank("error"):
        return worst
    explained = next((f for f in findings if f.code in KV_EXPLANATIONS), None)
    return explained or worst


def best_action(key: Optional[Finding], recommendations: Sequence[Recommendation]):  # -> (str, Optional[int])
    if key is not None and key.action:
        return "{} (from finding {})".format(key.action, key.code), None
    if recommendations:
        r = recommendations[0]
        gain = gain_words(r)
        return "{} {}{} ({}; recommendation 1 of {})".format(
            r.flag, r.value, ": " + gain if gain else "", r.basis, len(recommendations)), 0
    if key is not None and key.evidence and key.code in HEADLINES:
        return "none advised: read the failure at {} and what precedes it".format(key.evidence[0]), None
    return NO_ACTION, None


def gain_words(r: Recommendation) -> str:
    """'+3.01 GiB, +45,981 KV tokens per rank', or the requests it adds when it adds no tokens ('' for
    a fix, which gains nothing but a server that starts)."""
    parts = []
    if r.gain_bytes:
        parts.append("{:+.2f} GiB".format(r.gain_bytes / GIB))
    if r.gain_tokens:
        parts.append("{:+,} KV tokens".format(r.gain_tokens))
    more = r.gain_requests.get("at_request_tokens") if r.gain_requests else None
    if not parts and more:
        parts.append("{:+,} concurrent requests".format(more))
    return (", ".join(parts) + " per rank") if parts else ""


def _kv_per_rank(analysis: Any) -> Optional[int]:
    pools = [r.target.kv_bytes for r in analysis.ranks if r.target.kv_bytes is not None]
    return min(pools) if pools else None


def _sentence(text: str) -> str:
    return text if text.endswith((".", "?", "!")) else text + "."


def _first_sentence(text: str) -> str:
    head, dot, _ = text.partition(". ")
    return head + ("." if dot else "")
