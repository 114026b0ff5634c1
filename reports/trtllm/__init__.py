"""TensorRT-LLM's own parts of the report."""
