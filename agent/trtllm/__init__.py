"""TensorRT-LLM's forensics model: its startup analysis, rules, recommendations and live placement."""
