"""Who holds a GPU's memory and what each slice is: the words a ledger, a rule and a renderer share.

Apart from the live records (agent/model/live.py) so that a pasted log's analysis, whose rules and
JSON name these kinds, loads no record of a live node.
"""

from __future__ import annotations

from enum import Enum


class Owner(str, Enum):
    """Whose memory a GPU process holds, from the engine's process table."""

    ENGINE = "engine"  # the engine being explained
    OTHER_ENGINE = "other_engine"  # another inference server on the node
    FOREIGN = "foreign"  # any other process
    ORPHANED = "orphaned"  # NVML charges a PID the host's /proc does not have
    OTHER_NAMESPACE = "other_namespace"  # a PID kvforensics cannot see from its PID namespace (a container)


class ItemKind(str, Enum):
    """One slice of a GPU's memory. The values are stable (JSON, metrics)."""

    WEIGHTS = "weights"
    KV_POOL = "kv_pool"
    MAMBA = "mamba_state"
    GRAPHS = "cuda_graphs"
    WORKSPACES = "workspaces"  # attention workspaces + the req_to_token table
    DRAFT = "draft_model"
    ENGINE_UNLOGGED = "engine_unlogged"  # the engine process beyond its logged items
    ENGINE_PROCESS = "engine_process"  # the engine process, when no log says what is inside
    OTHER_ENGINES = "other_engines"
    FOREIGN = "foreign_processes"
    ORPHANED = "orphaned_pids"
    OTHER_NAMESPACE = "other_namespace_pids"
    NO_PROCESS = "no_process"  # NVML used minus every process: driver, other namespaces
    RESERVED = "driver_reserved"
    FREE = "free"
