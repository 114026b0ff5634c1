"""vLLM startup-log parsing (standard library only, Python 3.8)."""
