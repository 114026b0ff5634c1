"""Renderers: pure functions from analysis records to text (terminal, JSON; later Prometheus).

Nothing here prints or reads; ``agent/cli/`` writes what they return.
"""
