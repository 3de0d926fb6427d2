"""What the example tests share: the examples, their configs, offline overrides, the strategy check."""

from dataclasses import dataclass
from pathlib import Path

import yaml
from lightning.pytorch import LightningDataModule, LightningModule

from examples.digits.data import DigitsDataModule
from examples.digits.model import DigitsClassifier
from examples.mobilenet.data import ImageDataModule
from examples.mobilenet.model import MobileNetClassifier
from examples.roberta.data import GlueDataModule
from examples.roberta.model import RobertaClassifier

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
EPIPE_CLASS_PATH = "lightning_epipe.EPipeStrategy"


@dataclass(frozen=True)
class Example:
    name: str
    model_class: type[LightningModule]
    datamodule_class: type[LightningDataModule]
    offline_args: tuple[str, ...]  # make a config run here: no download, small and fast

    def configs(self) -> list[Path]:
        return sorted((EXAMPLES_DIR / self.name / "configs").glob("*.yaml"))


_FAST_DATA = ("--data.synthetic=true", "--data.synthetic_size=8", "--data.num_workers=0")
EXAMPLES = (
    Example("mobilenet", MobileNetClassifier, ImageDataModule, ("--model.pretrained=false", *_FAST_DATA)),
    Example("roberta", RobertaClassifier, GlueDataModule, ("--model.tiny=true", *_FAST_DATA)),
    Example("digits", DigitsClassifier, DigitsDataModule, ()),
)

ALL_CONFIGS = [(example, path) for example in EXAMPLES for path in example.configs()]


def config_id(case: tuple[Example, Path]) -> str:
    return f"{case[0].name}/{case[1].stem}"


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def uses_epipe(config: dict) -> bool:
    strategy = config["trainer"].get("strategy")
    return isinstance(strategy, dict) and strategy.get("class_path") == EPIPE_CLASS_PATH
