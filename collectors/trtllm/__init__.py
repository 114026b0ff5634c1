"""TensorRT-LLM's collectors: its log, its processes, its HTTP endpoints."""
