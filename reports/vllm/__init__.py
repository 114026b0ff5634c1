"""vLLM's own rendering: its per-worker table, in each format."""
