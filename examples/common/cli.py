"""The LightningCLI every example's ``main.py`` runs."""

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

MONITOR = {"class_path": "lightning_epipe.callbacks.EPipeMonitor"}


class ExampleCLI(LightningCLI):
    """LightningCLI that gives the model the data's class count (``data.num_classes``) and logs
    EPipe's metrics: ``trainer.callbacks`` defaults to ``[EPipeMonitor]``.

    A config's own ``trainer.callbacks`` list replaces the default (the pipelined configs list
    the monitor); ``--trainer.callbacks=[]`` removes it, as runs without ``EPipeStrategy`` must.
    """

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.set_defaults({"trainer.callbacks": [MONITOR]})


def run_cli(
    model_class: type[LightningModule],
    datamodule_class: type[LightningDataModule],
    args: list[str] | None = None,
    run: bool = True,
) -> ExampleCLI:
    """Parse ``args`` (``sys.argv`` when None) and, with ``run``, execute the subcommand.

    Optimizers come from the model's ``configure_optimizers`` (the report's settings), so the
    CLI's generic ``--optimizer``/``--lr_scheduler`` options are off.
    """
    return ExampleCLI(
        model_class,
        datamodule_class,
        args=args,
        run=run,
        auto_configure_optimizers=False,
        save_config_kwargs={"overwrite": True},
    )
