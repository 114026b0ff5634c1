"""Result records shared by the model, the rules and the renderers. Sizes are int bytes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple


@dataclass(frozen=True)
class Problem:
    """Something kvforensics could not do or could not know, with the reason."""

    code: str  # stable, dotted: "log.line_numbers_unknown"
    message: str


@dataclass(frozen=True)
class Finding:
    """A rule's conclusion: a stable code, a severity, the text for the reports, and the evidence it rests on."""

    code: str  # stable: scripts and alerts key on it
    severity: str  # info | warning | error | critical
    title: str
    detail: str
    bytes: Optional[int] = None
    evidence: Tuple[str, ...] = ()
    # For the report's verdict, when this finding is the answer: the figures that prove it in one
    # line, and what to do first when that comes before any flag change (a lost GPU, a fragment).
    proof: str = ""
    action: str = ""
    # For a finding that explains a figure (why the KV cache is its size): the mechanism in one or two
    # sentences with its figures, the verdict's cause when the report asks about that figure.
    mechanism: str = ""


@dataclass(frozen=True)
class Recommendation:
    """An engine flag change to propose: what it gains (None: not known), measured or estimated, and why."""

    flag: str
    value: str
    gain_bytes: Optional[int]
    gain_tokens: Optional[int]
    basis: str  # "measured" | "estimated"
    rationale: str
    gain_requests: Dict[str, Optional[int]] = field(default_factory=dict)  # "at_context_len", "at_request_tokens"
    # The finding it answers ("unused_gpu_memory", "low_headroom", "concurrency_bound", "startup_failed"), or
    # "" for none: when it is the report's best action, that finding is the verdict's cause.
    fixes: str = ""


@dataclass(frozen=True)
class KvCheck:
    """An engine's KV budget formula recomputed from the log's figures against the figure it logged, for one rank
    or worker (the kv_budget_check finding)."""

    rank: str
    formula: str
    predicted_bytes: Optional[int]
    logged_bytes: Optional[int]
    tolerance_bytes: int
    evidence: Tuple[str, ...]

    @property
    def agrees(self) -> Optional[bool]:
        if self.predicted_bytes is None or self.logged_bytes is None:
            return None
        return abs(self.predicted_bytes - self.logged_bytes) <= self.tolerance_bytes


@dataclass(frozen=True)
class KvChange:
    """An engine flag change that moves the KV pool by at most the bytes asked for, after the
    engine's own rounding of the flag: what the unused-memory finding quotes and the
    recommendation proposes, so both say the same GiB and the same tokens."""

    flag: str
    value: str
    gain_bytes: int  # per rank; negative: memory given back
    gain_tokens: int  # per rank
    rounding: str  # why gain_bytes differs from the bytes asked for (one sentence, said once)


@dataclass(frozen=True)
class Verdict:
    """The answer first: the question the report answers, the one-sentence cause, the figures
    that prove it, and the single best action with its gain (``agent/model/verdict.py``)."""

    question: str
    cause: str
    proof: str
    action: str
    cause_finding: Optional[str] = None  # the finding's code the cause is
    # The symptom beside a mechanism (unused memory, thin headroom): its figures are the proof; None when the
    # cause is the symptom's own finding or has none.
    symptom_finding: Optional[str] = None
    action_recommendation: Optional[int] = None  # 0-based index in the recommendations, when one is the action


@dataclass(frozen=True)
class Options:
    """Analysis knobs, all documented in the README."""

    margin_bytes: int = 2 << 30  # kept free for runtime activations not seen at startup
    margin_given: bool = False  # --margin given (else its default): said wherever the margin is
    request_tokens: int = 8192  # typical prompt + output length for concurrency estimates
    model_config: Optional[Dict[str, Any]] = None
    model_config_path: Optional[str] = None
