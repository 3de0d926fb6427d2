"""MobileNetV2 on CIFAR10/CIFAR100/Food101 from the command line.

    python examples/mobilenet/main.py fit --config examples/mobilenet/configs/cifar10_sortquant8.yaml
    python examples/mobilenet/main.py fit --config examples/mobilenet/configs/cifar10_none.yaml \\
        --data.synthetic true --model.pretrained false   # offline
"""

import sys
from pathlib import Path

# Run as a script, Python puts only this folder on the path: add the repository's root.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.common import run_cli  # noqa: E402
from examples.mobilenet.data import ImageDataModule  # noqa: E402
from examples.mobilenet.model import MobileNetClassifier  # noqa: E402

if __name__ == "__main__":
    run_cli(MobileNetClassifier, ImageDataModule)
