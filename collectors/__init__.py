"""Collectors: what kvforensics observes (engine logs, model configs, later NVML and host memory).

Rules (checked by tests/test_layering.py): standard library only, Python 3.8 grammar, no
imports from ``agent`` or ``reports``, so this package can be shipped to a remote host as the
probe. Parsing is pure (text in, frozen records out); reading is thin and separate.
"""
