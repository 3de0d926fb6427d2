"""Benchmarks of lightning_epipe: scripts under this folder, shared code in ``common``."""
