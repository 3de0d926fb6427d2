"""The pretrained MiniLM on docstrings of installed packages from the command line (no download).

    python examples/docstrings/main.py fit --config examples/docstrings/configs/docstrings_hadamard4.yaml
    python examples/docstrings/main.py test --config examples/docstrings/configs/docstrings_none.yaml \\
        --ckpt_path last
"""

import sys
from pathlib import Path

# Run as a script, Python puts only this folder on the path: add the repository's root.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.common import run_cli  # noqa: E402
from examples.docstrings.data import DocstringsDataModule  # noqa: E402
from examples.docstrings.model import MiniLMClassifier  # noqa: E402

if __name__ == "__main__":
    run_cli(MiniLMClassifier, DocstringsDataModule)
