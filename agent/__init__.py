"""The forensics model: what the collected evidence means (ledgers, budgets, findings)."""
