"""SGLang's own rendering: its per-rank ledger, bars and reserve, in each format."""
