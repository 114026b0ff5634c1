"""SGLang as an engine: its log line formats, startup segmentation, server_args and processes."""
