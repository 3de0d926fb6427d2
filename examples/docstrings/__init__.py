"""Pretrained MiniLM fine-tuned on docstrings of installed Python packages."""
