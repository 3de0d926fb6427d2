"""Runnable examples of ``lightning_epipe``: the report's experiments and the digits demo."""
