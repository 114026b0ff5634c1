"""Words and colours for the model's enums: the only place display text is chosen.

The model says *what* (``ItemKind``); renderers say it in words (JSON ``ledger[].item`` keeps
these labels for compatibility) and paint it in colours.
"""

from __future__ import annotations

from typing import Dict, Optional

from agent.live import ItemKind

ITEM_LABELS: Dict[ItemKind, str] = {
    ItemKind.WEIGHTS: "weights",
    ItemKind.KV_POOL: "KV pool",
    ItemKind.MAMBA: "Mamba state",
    ItemKind.GRAPHS: "CUDA graphs",
    ItemKind.WORKSPACES: "workspaces + req_to_token",
    ItemKind.DRAFT: "draft model",
    ItemKind.ENGINE_UNLOGGED: "engine, not in the log",
    ItemKind.ENGINE_PROCESS: "engine process",
    ItemKind.OTHER_ENGINES: "other SGLang engines",
    ItemKind.FOREIGN: "other processes",
    ItemKind.ORPHANED: "PIDs that no longer exist",
    ItemKind.OTHER_NAMESPACE: "PIDs in another PID namespace",
    ItemKind.NO_PROCESS: "no process (driver, other namespaces)",
    ItemKind.RESERVED: "reserved by the driver",
    ItemKind.FREE: "free",
}

# Bar colours; an item without one (free) is left blank in the bars.
ITEM_COLOURS: Dict[ItemKind, Optional[str]] = {
    ItemKind.WEIGHTS: "blue", ItemKind.KV_POOL: "green", ItemKind.MAMBA: "green4", ItemKind.GRAPHS: "magenta",
    ItemKind.WORKSPACES: "grey62", ItemKind.DRAFT: "dark_orange", ItemKind.ENGINE_UNLOGGED: "grey50",
    ItemKind.ENGINE_PROCESS: "grey50", ItemKind.OTHER_ENGINES: "cyan", ItemKind.FOREIGN: "red",
    ItemKind.ORPHANED: "bright_red", ItemKind.OTHER_NAMESPACE: "grey70",
    ItemKind.NO_PROCESS: "yellow", ItemKind.RESERVED: "grey37", ItemKind.FREE: None,
}
assert set(ITEM_LABELS) == set(ItemKind) == set(ITEM_COLOURS), "every ledger item needs a label and a colour"
