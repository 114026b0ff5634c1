"""The forensics model: a snapshot typed at the edge, the live ledger, the rule book and its engine-
neutral rules, the verdict."""
