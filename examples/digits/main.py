"""The digits MLP from the command line (no download needed).

    python examples/digits/main.py fit --config examples/digits/configs/digits_sortquant8.yaml
"""

import sys
from pathlib import Path

# Run as a script, Python puts only this folder on the path: add the repository's root.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.common import run_cli  # noqa: E402
from examples.digits.data import DigitsDataModule  # noqa: E402
from examples.digits.model import DigitsClassifier  # noqa: E402

if __name__ == "__main__":
    run_cli(DigitsClassifier, DigitsDataModule)
