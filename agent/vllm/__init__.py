"""vLLM\x27s memory model, stages, rules and recommendations."""
