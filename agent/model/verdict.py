"""The answer first: a report's verdict, derived from the findings and recommendations already made.

Engine-neutral. It reads the engine's analysis through the protocol ``agent/model/node_rules.py``
describes (``failed``, ``complete``, ``summary.max_total_num_tokens``, ``ranks[].target.kv_bytes``)
and chooses, in this order:

* the cause: the startup's headline (failed, or a fragment), else what breaks the node (a
  critical or error finding: a lost GPU, leaked memory), else less free memory than the margin (an
  out-of-memory risk comes before any gain), else the finding the best action fixes
  (``Recommendation.fixes``: unused memory, what bounds concurrency), else the finding with advice of
  its own (unused memory this log cannot size), else the explanation of the KV size
  (``mem_fraction_semantics``; vLLM's ``gpu_memory_utilization_semantics``; TensorRT-LLM's
  ``kv_fraction_semantics``), else the most severe finding;
* the proof: for a cause about memory or concurrency, the KV explanation's figures (why the pool is
  what it is) first, then the cause's own; else the cause's own figures;
* the action: the first recommendation when it fixes the cause, else what the cause says to do first (a
  finding's ``action``: reset a lost GPU, paste the whole startup), else the first recommendation
  (recommenders are ordered best first), else nothing worth a restart.

Proof and action are cut to what the terminal shows at 80 columns (two lines of ``VERDICT_WIDTH``),
by whole "; "-separated clauses; a clause cut inside ends at a word that is not a figure, with " …".
The verdict's words are the findings' own; only the question is written here.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from kvforensics.agent.model.records import Finding, Recommendation, Verdict
from kvforensics.agent.model.severity import severity_rank
from kvforensics.collectors.units import GIB, gib

HEADLINES = ("startup_failed", "incomplete_startup")
KV_EXPLANATIONS = ("mem_fraction_semantics", "gpu_memory_utilization_semantics", "kv_fraction_semantics")
# Causes the KV explanation proves: why the pool is its size is the evidence for what to change.
EXPLAINED_BY_KV = ("unused_gpu_memory", "low_headroom", "concurrency_bound")
NO_ACTION = "none: no flag change gains enough to be worth a restart"
NO_ENGINE_ACTION = "none: without the engine's startup log there is no flag to size"
# The terminal prints the verdict's texts beside a 10-column label, at most 2 lines each
# (reports/terminal.py VERDICT_LABEL); 80 columns is the narrowest width every report fits.
VERDICT_WIDTH = 70
VERDICT_LINES = 2
# A mechanism is a sentence or two with its figures: it may take five lines, and is never cut inside one.
CAUSE_LINES = 5
CLAUSE = "; "


def verdict(analysis: Optional[Any], live: bool, findings: Sequence[Finding],
            recommendations: Sequence[Recommendation]) -> Verdict:
    key = key_finding(findings, recommendations)
    action, index = best_action(key, recommendations)
    if action == NO_ACTION and analysis is None:
        action = NO_ENGINE_ACTION
    if key is None:
        return Verdict(question=question(analysis, live), cause="nothing to report: no finding", proof="",
                       action=action, cause_finding=None, action_recommendation=index)
    explained = mechanism_for(analysis, key, findings)
    if explained is not None:
        symptom = key if key.code != explained.code else None
        return Verdict(question=question(analysis, live), cause=fit(explained.mechanism, CAUSE_LINES),
                       proof=fit(symptom.proof or _first_sentence(symptom.detail)) if symptom else fit(explained.proof),
                       action=action, cause_finding=explained.code, symptom_finding=symptom.code if symptom else None,
                       action_recommendation=index)
    return Verdict(question=question(analysis, live), cause=_sentence(key.title), proof=proof(key, findings),
                   action=action, cause_finding=key.code, action_recommendation=index)


def mechanism_for(analysis: Optional[Any], key: Finding, findings: Sequence[Finding]) -> Optional[Finding]:
    """The KV explanation whose mechanism answers the question, when the question is why the KV cache is its
    size (a finished startup with a KV figure) and the key finding is about that memory (or is the
    explanation itself): the symptom is then its proof, never the cause."""
    if analysis is None or analysis.failed is not None or not analysis.complete or _kv_per_rank(analysis) is None:
        return None
    if key.code not in EXPLAINED_BY_KV + KV_EXPLANATIONS:
        return None
    explained = _kv_explanation(findings)
    return explained if explained is not None and explained.mechanism else None


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


def key_finding(findings: Sequence[Finding],
                recommendations: Sequence[Recommendation] = ()) -> Optional[Finding]:
    if not findings:
        return None
    if findings[0].code in HEADLINES:  # the rule book puts the headline first
        return findings[0]
    worst = max(findings, key=lambda f: severity_rank(f.severity))
    if severity_rank(worst.severity) >= severity_rank("error"):
        return worst
    short = next((f for f in findings if f.code == "low_headroom"), None)
    if short is not None:  # an out-of-memory risk comes before any gain
        return short
    fixed = _fixed_by(recommendations, findings)
    if fixed is not None:
        return fixed
    advised = [f for f in findings if f.action]
    if advised:
        return max(advised, key=lambda f: severity_rank(f.severity))
    explained = _kv_explanation(findings)
    return explained or worst


def _fixed_by(recommendations: Sequence[Recommendation], findings: Sequence[Finding]) -> Optional[Finding]:
    """The finding the best action answers, when the report has it."""
    if not recommendations or not recommendations[0].fixes:
        return None
    return next((f for f in findings if f.code == recommendations[0].fixes), None)


def _kv_explanation(findings: Sequence[Finding]) -> Optional[Finding]:
    return next((f for f in findings if f.code in KV_EXPLANATIONS), None)


def proof(key: Finding, findings: Sequence[Finding]) -> str:
    """The figures that prove the cause, cut to the verdict's two lines by whole clauses."""
    own = key.proof or _first_sentence(key.detail)
    explained = _kv_explanation(findings) if key.code in EXPLAINED_BY_KV else None
    if explained is not None and explained.proof:
        return fit(CLAUSE.join(x for x in (explained.proof, key.proof) if x))
    return fit(own)


def best_action(key: Optional[Finding], recommendations: Sequence[Recommendation]) -> Tuple[str, Optional[int]]:
    if recommendations and key is not None and recommendations[0].fixes == key.code:
        return _recommended(recommendations), 0
    if key is not None and key.action:
        said = "{} (from finding {})".format(key.action, key.code)
        return (said if fits(said) else fit(key.action)), None
    if recommendations:
        return _recommended(recommendations), 0
    if key is not None and key.evidence and key.code == "startup_failed":
        return "none advised: read the failure at {} and what precedes it".format(key.evidence[0]), None
    return NO_ACTION, None


def _recommended(recommendations: Sequence[Recommendation]) -> str:
    r = recommendations[0]
    gain = gain_words(r)
    return "{} {}{} ({}; recommendation 1 of {})".format(
        r.flag, r.value, ": " + gain if gain else "", r.basis, len(recommendations))


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


# --- fitting the verdict's two lines ----------------------------------------------------------

def fits(text: str, width: int = VERDICT_WIDTH, lines: int = VERDICT_LINES) -> bool:
    """Whether greedy word wrap at ``width`` (as the terminal wraps) needs at most ``lines`` lines."""
    used, line = 1, 0
    for word in text.split():
        if line and line + 1 + len(word) > width:
            used, line = used + 1, len(word)
        else:
            line += (1 if line else 0) + len(word)
    return used <= lines and all(len(w) <= width for w in text.split())


def fit(text: str, lines: int = VERDICT_LINES) -> str:
    """``text`` as the clauses that fit the verdict's lines: as many of the leading clauses as fit whole,
    the first one shortened to make room for the others only while it keeps a line of its own. With more
    than the proof's two lines (a cause), whole sentences are kept, never a cut one."""
    if fits(text, lines=lines):
        return text
    if lines != VERDICT_LINES:
        sentences = text.split(". ")
        for keep in range(len(sentences) - 1, 0, -1):
            head = ". ".join(sentences[:keep]) + "."
            if fits(head, lines=lines):
                return head
        return text  # one sentence longer than the lines: whole, the terminal wraps it
    clauses = text.split(CLAUSE)
    for keep in range(len(clauses), 0, -1):
        tail = clauses[1:keep]
        head = _shorten(clauses[0], tail)
        if head is not None and (head == clauses[0] or not tail or len(head) >= VERDICT_WIDTH):
            return CLAUSE.join([head] + tail)
    return clauses[0]  # one word wider than the lines: the terminal breaks it


def _shorten(clause: str, tail: List[str]) -> Optional[str]:
    """The clause itself, or its longest word-prefix that fits before ``tail`` with " …" — never ending on
    a figure (a number cut from its unit, or a number cut short) nor inside parentheses; None when not even
    one word fits."""
    rest = "".join(CLAUSE + t for t in tail)
    if fits(clause + rest):
        return clause
    words = clause.split()
    for n in range(len(words) - 1, 0, -1):
        kept = " ".join(words[:n])
        if any(ch.isdigit() for ch in words[n - 1]) or kept.count("(") > kept.count(")"):
            continue
        cut = kept + " …"
        if fits(cut + rest):
            return cut
    return None


def _kv_per_rank(analysis: Any) -> Optional[int]:
    pools = [r.target.kv_bytes for r in analysis.ranks if r.target.kv_bytes is not None]
    return min(pools) if pools else None


def _sentence(text: str) -> str:
    return text if text.endswith((".", "?", "!")) else text + "."


def _first_sentence(text: str) -> str:
    head, dot, _ = text.partition(". ")
    return head + ("." if dot else "")
