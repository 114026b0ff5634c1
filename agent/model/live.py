"""Records of a live node: each GPU's NVML figures, its processes, and the split of its memory.

Engine-neutral: a ledger item says *what* holds the memory (an ``ItemKind``); the renderers
choose the words and colours. Sizes are int bytes; unknown is None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple, Union

from kvforensics.agent.model.kinds import ItemKind, Owner
from kvforensics.agent.model.records import Finding, Options, Problem, Recommendation, Verdict

if TYPE_CHECKING:  # annotations only: a log's analysis never loads the snapshot's records
    from kvforensics.agent.model.evidence import Engine, HostMemory, Snapshot


@dataclass(frozen=True)
class LedgerItem:
    """A share of a GPU's memory: what holds it (an ItemKind), its bytes (None: unknown), where the figure came from."""

    kind: ItemKind
    bytes: Optional[int]
    source: str


@dataclass(frozen=True)
class GpuProcess:
    """A process using a GPU now: NVML's figure for it, whose it is (an Owner), and the engine rank it runs if any."""

    pid: int
    used_bytes: Optional[int]
    name: str  # command line, shortened
    owner: Owner
    rank: Optional[str] = None
    user: Optional[str] = None
    container: Optional[str] = None


@dataclass(frozen=True)
class GpuLedger:
    """One GPU now. NVML figures are raw; the split below them is the reconciliation."""

    index: int
    status: str
    uuid: Optional[str]
    name: Optional[str]
    total_bytes: Optional[int]
    reserved_bytes: Optional[int]
    used_bytes: Optional[int]
    free_bytes: Optional[int]
    processes: Tuple[GpuProcess, ...]
    rank: Optional[str] = None  # the engine rank running here
    items: Tuple[LedgerItem, ...] = ()  # sums to used (+ reserved + free)
    problems: Tuple[Problem, ...] = ()
    pci_bus_id: Optional[str] = None

    def held_by(self, owner: Owner) -> int:
        return sum(p.used_bytes or 0 for p in self.processes if p.owner is owner)


@dataclass(frozen=True)
class Inspection:
    """A node inspected: its snapshot, the engine's startup analysis, each GPU's ledger, what the rules make of them."""

    target: str
    status: str  # "ok" | "partial" | "error"
    problems: Tuple[Problem, ...]
    snapshot: Snapshot
    analysis: Optional[Any]  # the engine's startup Analysis, when its log was read
    gpus: Tuple[GpuLedger, ...]
    host_memory: HostMemory
    options: Options
    findings: Tuple[Finding, ...] = ()
    recommendations: Tuple[Recommendation, ...] = ()
    collected_nothing: bool = False
    engine: Optional[str] = None  # "sglang-<port>" / "vllm-<port>" of the engine explained
    engine_args: Optional[Dict[str, Any]] = None  # its flags from the command line (secrets redacted)
    history: Optional[Any] = None  # agent.history.store.RunStats of the current engine run, when recorded
    other_engines: Tuple[Engine, ...] = ()  # the node's other servers
    verdict: Optional[Verdict] = None  # the answer first, from the findings and recommendations
    engine_kind: Optional[str] = None  # "sglang" | "vllm"

    @property
    def engine_gpus(self) -> Tuple[GpuLedger, ...]:
        return tuple(g for g in self.gpus if g.rank is not None)


@dataclass(frozen=True)
class TargetFailure:
    """A target that could not be collected at all (an SSH host down, refused, …)."""

    target: str
    status: str  # unreachable | auth_failed | host_key_refused | error
    code: str
    message: str


# What one target of a command came to: an inspection, or why there is none.
TargetResult = Union[Inspection, TargetFailure]
