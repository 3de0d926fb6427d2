"""RoBERTa on GLUE RTE/CoLA from the command line.

    python examples/roberta/main.py fit --config examples/roberta/configs/rte_sortquant8.yaml
    python examples/roberta/main.py fit --config examples/roberta/configs/rte_none.yaml \\
        --data.synthetic true --model.tiny true   # offline
"""

import sys
from pathlib import Path

# Run as a script, Python puts only this folder on the path: add the repository's root.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.common import run_cli  # noqa: E402
from examples.roberta.data import GlueDataModule  # noqa: E402
from examples.roberta.model import RobertaClassifier  # noqa: E402

if __name__ == "__main__":
    run_cli(RobertaClassifier, GlueDataModule)
