"""Words and colours for the model's enums: the only place display text is chosen.

The model says *what* (``ItemKind``); renderers say it in words (JSON ``ledger[].item`` keeps
these labels for compatibility) and paint it in colours.
"""

from __future__ import annotations

from typing import Dict, Optional

from kvforensics.agent.model.kinds import ItemKind

ITEM_LABELS: Dict[ItemKind, str] = {
    ItemKind.WEIGHTS: "weights",
    ItemKind.KV_POOL: "KV pool",
    ItemKind.MAMBA: "Mamba state",
    ItemKind.GRAPHS: "CUDA graphs",
    ItemKind.WORKSPACES: "workspaces + req_to_token",
    ItemKind.DRAFT: "draft model",
    ItemKind.ENGINE_UNLOGGED: "engine, not in the log",
    ItemKind.ENGINE_PROCESS: "engine process",
    ItemKind.OTHER_ENGINES: "other inference servers",
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

# Bar glyphs without colour (NO_COLOR, --no-color, pasted into a ticket): one letter per item, so
# a pasted bar still says what is where; free memory is '.'. With colour every item is '█'.
FREE_GLYPH = "."
ITEM_GLYPHS: Dict[ItemKind, str] = {
    ItemKind.WEIGHTS: "W", ItemKind.KV_POOL: "K", ItemKind.MAMBA: "M", ItemKind.GRAPHS: "G",
    ItemKind.WORKSPACES: "A", ItemKind.DRAFT: "D", ItemKind.ENGINE_UNLOGGED: "e", ItemKind.ENGINE_PROCESS: "E",
    ItemKind.OTHER_ENGINES: "O", ItemKind.FOREIGN: "F", ItemKind.ORPHANED: "X", ItemKind.OTHER_NAMESPACE: "P",
    ItemKind.NO_PROCESS: "N",
    ItemKind.RESERVED: "R", ItemKind.FREE: FREE_GLYPH,
}
assert set(ITEM_GLYPHS) == set(ItemKind) and len(set(ITEM_GLYPHS.values())) == len(ItemKind), "one glyph per item"

# The startup ledger's items (reports/terminal.py LEDGER_ROWS), by their label.
LEDGER_GLYPHS: Dict[str, str] = {
    "weights": "W", "KV pool": "K", "Mamba state": "M", "req_to_token table (computed)": "T",
    "attention workspaces": "A", "CUDA graphs": "G", "draft weights": "d", "draft KV pool": "k",
    "draft CUDA graphs": "g", "unexplained": "u", "free after startup": FREE_GLYPH,
}
assert len(set(LEDGER_GLYPHS.values())) == len(LEDGER_GLYPHS), "one glyph per ledger item"
