"""A small pipelined training in real processes, for the tests (not collected by pytest).

    python tests/strategy/scenario.py --out result.pt --devices 3 --steps 4 --compressor none

Lightning's launcher forks the ranks from this process (``--start-method fork``, the default
here: a rank starts without importing torch and Lightning again, seconds of CPU per process
on a small machine); rank 0 writes the losses it saw to ``--out`` and this process adds the
consolidated weights Lightning gave back to it. ``--start-method popen`` (the strategy's
default) re-runs this script once per rank instead, for the tests of what that launcher
does: faults, signals, nodes, core binding, GPUs. ``reference()`` trains the same module in
one process without the strategy.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import time
from datetime import timedelta

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L
from lightning.pytorch.plugins.precision import MixedPrecision


def make_data(n: int = 96, features: int = 16, classes: int = 4, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, classes, generator=g)
    y = (x @ w).argmax(dim=1)
    return TensorDataset(x, y)


class TinyNet(L.LightningModule):
    """``layers``: 8 children (Linear/Tanh), so every placement up to 4 processes fits."""

    def __init__(self, lr: float = 0.1, optimizer: str = "sgd", manual: bool = False,
                 manual_clip: tuple[str, float] | None = None) -> None:
        super().__init__()
        torch.manual_seed(1234)
        self.layers = nn.Sequential(
            nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
            nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 16), nn.Linear(16, 4),
        )
        self.lr = lr
        self.optimizer_name = optimizer
        self.automatic_optimization = not manual
        self.manual_clip = manual_clip  # manual optimization: (algorithm, value) for self.clip_gradients
        self.losses: list[float] = []
        self.val_losses: list[float] = []
        self.scales: list[float] = []  # the GradScaler's scale after each step (precision 16-mixed)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.layers(x), y)
        self.losses.append(float(loss))
        self.log("train_loss", loss)
        if not self.automatic_optimization:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            if self.manual_clip is not None:
                algorithm, value = self.manual_clip
                self.clip_gradients(opt, gradient_clip_val=value, gradient_clip_algorithm=algorithm)
            opt.step()
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            self.scales.append(float(scaler.get_scale()))

    def pipeline_loss(self, output, batch):
        """One micro-batch's mean loss, for EPipeStrategy(schedule="1f1b")."""
        return nn.functional.cross_entropy(output, batch[1])

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.layers(x), y)
        self.val_losses.append(float(loss))
        self.log("val_loss", loss)

    def predict_step(self, batch, batch_idx):
        return self.layers(batch[0])

    def configure_optimizers(self):
        if self.optimizer_name == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.lr)
        if self.optimizer_name == "adam-steplr":  # the layers only, and a per-step schedule
            optimizer = torch.optim.Adam(self.layers.parameters(), lr=self.lr / 10)
            schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class ShrinkAfterStep(TinyNet):
    """TinyNet whose own ``optimizer_step`` hook scales every weight by 0.9 after the optimizer's step."""

    def optimizer_step(self, *args, **kwargs):
        super().optimizer_step(*args, **kwargs)
        with torch.no_grad():
            for p in self.parameters():
                p.mul_(0.9)


def loader(batch_size: int) -> DataLoader:
    return DataLoader(make_data(), batch_size=batch_size, shuffle=False)


def trainer_kwargs(steps: int, **extra) -> dict:
    return dict(
        max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, **{"num_sanity_val_steps": 0, "limit_val_batches": 0, **extra},
    )


def fp16_mixed(init_scale: float, device: str = "cpu") -> MixedPrecision:
    """precision="16-mixed" (on the CPU Lightning's flag turns into bf16): float16 autocast on
    ``device`` and a GradScaler starting at ``init_scale`` that backs off 64x at an overflow."""
    return MixedPrecision("16-mixed", device, scaler=torch.amp.GradScaler(device, init_scale=init_scale,
                                                                          backoff_factor=2.0 ** -6))


def reference(steps: int, batch_size: int, clip: float | None = None, accumulate: int = 1,
              fp16_scale: float | None = None, precision: str = "32-true", shrink: bool = False,
              **model_kwargs) -> TinyNet:
    """The same training in one process without EPipeStrategy (``shrink``: :class:`ShrinkAfterStep`)."""
    model = (ShrinkAfterStep if shrink else TinyNet)(**model_kwargs)
    precision_args = {"plugins": [fp16_mixed(fp16_scale)]} if fp16_scale else {"precision": precision}
    trainer = L.Trainer(devices=1, gradient_clip_val=clip, accumulate_grad_batches=accumulate, **precision_args,
                        **trainer_kwargs(steps))
    trainer.fit(model, loader(batch_size))
    return model


class SlowOptimizerStep(L.Callback):
    """Rank ``rank`` takes ``seconds`` longer before each optimizer step (a slow first stage)."""

    def __init__(self, rank: int, seconds: float) -> None:
        self.rank, self.seconds = rank, seconds

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if trainer.global_rank == self.rank:
            time.sleep(self.seconds)


class PrintStartedAhead(L.Callback):
    """Every rank prints how many training steps it started ahead of Lightning's (servers only)."""

    def on_train_end(self, trainer, pl_module):
        print(f"rank {trainer.global_rank} started {trainer.strategy._steps.steps_started_ahead} steps ahead", flush=True)


class PrintCores(L.Callback):
    """Every rank prints the CPU cores its process, and gloo's threads, may run on."""

    def on_train_start(self, trainer, pl_module):
        threads = {int(t): sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
        print(f"rank {trainer.global_rank} cores {sorted(os.sched_getaffinity(0))} threads {json.dumps(threads)}", flush=True)


class PrintFrozenObjects(L.Callback):
    """Every rank prints how many objects the garbage collector leaves frozen while it trains."""

    def on_train_start(self, trainer, pl_module):
        print(f"rank {trainer.global_rank} training frozen {gc.get_freeze_count()}", flush=True)


def rank_zero_result(trainer, model) -> dict:
    """What rank 0 saw in training: its losses and metrics, its counters per link, auto's choices."""
    strategy = trainer.strategy
    return {"losses": model.losses, "val_losses": model.val_losses, "scales": model.scales, "device": str(strategy.root_device),
            "callback_metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
            "stats": link_stats(trainer), "auto": strategy.auto_choices,
            "auto_history": [{"step": step, "link": f"{c.direction}/cut{c.cut}", "codec": c.label,
                              "bandwidth": c.bandwidth, "reason": c.reason, "error": c.error} for step, c in strategy.auto_history]}


def link_stats(trainer) -> dict:
    """Rank 0's counters per link (messages, bytes on the wire, raw bytes, ...) so far."""
    return {k.label(0): v.as_list() for k, v in trainer.strategy.stats.links.items()}


class SaveRankZeroResult(L.Callback):
    """Under a spawning launcher (the launching process is not a rank, and Lightning returns no
    predictions from it), rank 0 writes what it saw in training to ``path`` at the end of fit, and
    adds its predictions at the end of predict."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.predictions: list[torch.Tensor] = []

    def on_fit_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            torch.save(rank_zero_result(trainer, pl_module), self.path)

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.predictions.append(outputs)

    def on_predict_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            result = torch.load(self.path, weights_only=False)
            torch.save({**result, "predictions": torch.cat(self.predictions)}, self.path)


class InjectFault(L.Callback):
    """Make rank ``rank`` misbehave at training batch ``step`` (tests of issue "faults")."""

    def __init__(self, kind: str, rank: int, step: int) -> None:
        self.kind, self.rank, self.step = kind, rank, step

    def on_fit_start(self, trainer, pl_module):
        if trainer.global_rank != self.rank:
            return
        if self.kind in ("nan", "raise", "overflow"):
            def hook(module, args, output):
                if trainer.training and trainer.global_step == self.step:
                    if self.kind == "raise":
                        raise RuntimeError(f"injected failure on rank {self.rank}")
                    return output * (1e6 if self.kind == "overflow" else float("nan"))  # overflow: past fp16's range
                return output

            owned = trainer.strategy.plan.layers_of(self.rank)
            pl_module.layers[owned[-1 if self.kind == "overflow" else 0]].register_forward_hook(hook)  # overflow: at the cut
        if self.kind == "corrupt":  # flip a payload byte after the checksum was taken, as a bad link would
            from lightning_epipe.strategy.comm import transport

            original_post = transport.Transport._post

            def post(tr, frame, *args, **kwargs):
                if trainer.global_step == self.step and frame.numel() > 160:
                    frame = frame.clone()
                    frame[-1] ^= 0xFF
                return original_post(tr, frame, *args, **kwargs)

            transport.Transport._post = post
        if self.kind == "misorder":
            from lightning_epipe.strategy.comm import transport

            original = transport.Transport.send

            def send(tr, peer, header, payload=None, **kwargs):
                if trainer.global_step == self.step and payload is not None and payload.numel() > 64:
                    header = header._replace(microbatch=header.microbatch + 1)
                return original(tr, peer, header, payload, **kwargs)

            transport.Transport.send = send

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # SIGTERM, as a cluster preempting the job sends it, when the client has ended a step that the
        # servers may still be finishing (nothing lines the ranks up between steps); Lightning's
        # launcher passes it on to the other ranks
        if self.kind == "sigterm" and trainer.global_rank == self.rank and trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        # the same in a standalone trainer.validate(): the client stops after this batch
        if self.kind == "sigterm-validate" and trainer.global_rank == self.rank and batch_idx == self.step:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            if self.kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.kind == "stall":
                time.sleep(3600)


def main() -> None:
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from lightning_epipe import EPipeStrategy

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--devices", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--compressor", default="none")
    p.add_argument("--bits", type=int, default=None)
    p.add_argument("--placement", default="client-server")
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--manual", action="store_true")
    p.add_argument("--manual-clip", default=None, help="manual optimization's clip_gradients, e.g. norm:0.05 or value:0.01")
    p.add_argument("--clip", type=float, default=None)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--val", action="store_true", help="validation data, ModelCheckpoint(monitor) and EarlyStopping")
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--resume", default=None)
    p.add_argument("--nonfinite", default="raise")
    p.add_argument("--fault", default=None, choices=["kill", "stall", "raise", "nan", "overflow", "corrupt", "misorder", "sigterm", "sigterm-validate"])
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=2)
    p.add_argument("--precision", default="32-true")
    p.add_argument("--fp16-scale", type=float, default=None, help="16-mixed, the GradScaler's init_scale")
    p.add_argument("--start-method", default="fork", help="popen: Lightning re-runs this script per rank")
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--checkpoint", default="never", help="activation recomputation")
    p.add_argument("--balance", default=None, help="'time', 'parameters' or comma-separated layer counts")
    p.add_argument("--compressor-kwargs", default="{}", help="JSON, e.g. '{\"ratio\": 0.25}'")
    p.add_argument("--error-feedback", action="store_true")
    p.add_argument("--delta", action="store_true", help="delta compression of activations (AQ-SGD)")
    p.add_argument("--replicas", type=int, default=1, help="pipelines trained data-parallel")
    p.add_argument("--schedule", default="gpipe")
    p.add_argument("--delta-cache-limit", type=int, default=None)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--backend", default=None, help="process_group_backend, e.g. gloo between GPUs")
    p.add_argument("--bind-cores", action="store_true", help="every rank prints the CPU cores it runs on")
    p.add_argument("--no-start-ahead", action="store_true", help="EPipeStrategy(start_ahead=False)")
    p.add_argument("--no-freeze-gc", action="store_true", help="EPipeStrategy(freeze_gc=False)")
    p.add_argument("--print-gc", action="store_true", help="every rank prints its frozen objects in training and after fit")
    p.add_argument("--split-backward", default="auto", choices=["auto", "true", "false"], help="EPipeStrategy(split_backward=...)")
    p.add_argument("--slow-rank", type=int, default=None, help="this rank sleeps --slow-seconds before each optimizer step")
    p.add_argument("--slow-seconds", type=float, default=0.1)
    p.add_argument("--shrink", action="store_true",
                   help="the module's own optimizer_step scales the weights after the step")
    args = p.parse_args()

    strategy = EPipeStrategy(
        chunks=args.chunks, schedule=args.schedule, compressor=args.compressor, bits=args.bits, placement=args.placement,
        timeout=timedelta(seconds=args.timeout), nonfinite=args.nonfinite, start_method=args.start_method,
        checkpoint=args.checkpoint, compressor_kwargs=json.loads(args.compressor_kwargs),
        error_feedback=args.error_feedback, replicas=args.replicas, delta_compression=args.delta, delta_cache_limit=args.delta_cache_limit,
        balance=[int(b) for b in args.balance.split(",")] if args.balance and "," in args.balance else args.balance,
        process_group_backend=args.backend, bind_cores=args.bind_cores, start_ahead=not args.no_start_ahead,
        freeze_gc=not args.no_freeze_gc,
        split_backward={"auto": "auto", "true": True, "false": False}[args.split_backward],
    )
    manual_clip = None
    if args.manual_clip:
        algorithm, value = args.manual_clip.split(":")
        manual_clip = (algorithm, float(value))
    module_class = ShrinkAfterStep if args.shrink else TinyNet
    model = module_class(optimizer=args.optimizer, manual=args.manual, manual_clip=manual_clip)
    if args.balance == "time":
        model.example_input_array = torch.zeros(8, 16)
    if args.compressor == "bottleneck":  # real samples: the bottlenecks start from their PCA
        model.example_input_array = make_data().tensors[0][:64]
    callbacks = [PrintStartedAhead()]
    if args.slow_rank is not None:
        callbacks.append(SlowOptimizerStep(args.slow_rank, args.slow_seconds))
    extra = dict(gradient_clip_val=args.clip, accumulate_grad_batches=args.accumulate)
    if args.fault:
        callbacks.append(InjectFault(args.fault, args.fault_rank, args.fault_step))
    if args.bind_cores:
        callbacks.append(PrintCores())
    if args.print_gc:
        callbacks.append(PrintFrozenObjects())
    if args.start_method != "popen":
        callbacks.append(SaveRankZeroResult(args.out))
    if args.ckpt_dir:
        callbacks.append(ModelCheckpoint(dirpath=args.ckpt_dir, filename="{epoch}", save_top_k=-1, every_n_epochs=1))
    if args.val:
        callbacks.append(ModelCheckpoint(dirpath=args.ckpt_dir, filename="best", monitor="val_loss", save_top_k=1))
        callbacks.append(EarlyStopping(monitor="val_loss", patience=100))
    kwargs = trainer_kwargs(args.steps if args.epochs is None else -1, callbacks=callbacks, **extra)
    if args.epochs is not None:
        kwargs["max_epochs"] = args.epochs
    if args.val:
        kwargs.update(limit_val_batches=None, num_sanity_val_steps=2)
    if args.fault == "sigterm-validate":
        kwargs.update(limit_val_batches=None)
    if args.ckpt_dir:
        kwargs["enable_checkpointing"] = True
    kwargs["accelerator"] = args.accelerator
    if args.fp16_scale:
        kwargs["plugins"] = [fp16_mixed(args.fp16_scale, "cuda" if args.accelerator == "gpu" else "cpu")]
    else:
        kwargs["precision"] = args.precision
    trainer = L.Trainer(devices=args.devices, num_nodes=args.num_nodes, strategy=strategy, **kwargs)
    if args.fault == "sigterm-validate":  # a standalone validate, stopped by SIGTERM
        try:
            trainer.validate(model, loader(args.batch_size), verbose=False)
        except SIGTERMException:
            done = trainer.validate_loop.batch_progress.current.completed
            print(f"rank {trainer.global_rank} stopped by SIGTERM after validation batch {done}", flush=True)
            raise
        return
    try:
        trainer.fit(model, loader(args.batch_size), loader(args.batch_size) if args.val else None, ckpt_path=args.resume)
    except SIGTERMException:
        print(f"rank {trainer.global_rank} stopped by SIGTERM at global_step {trainer.global_step}", flush=True)
        raise
    if args.print_gc:
        print(f"rank {trainer.global_rank} after fit frozen {gc.get_freeze_count()}", flush=True)
    if args.start_method != "popen":  # the launching process is not a rank: rank 0 wrote what it saw
        # (SaveRankZeroResult), and Lightning's launcher gave the trained weights back to this one;
        # forked ranks predict next (spawned ones would import everything again: left out)
        if args.start_method == "fork":
            trainer.predict(model, loader(args.batch_size))
        torch.save({**torch.load(args.out, weights_only=False), "state_dict": model.state_dict()}, args.out)
        return
    result = rank_zero_result(trainer, model)
    predictions = trainer.predict(model, loader(args.batch_size))
    if trainer.is_global_zero:
        torch.save({**result, "state_dict": model.state_dict(), "predictions": torch.cat(predictions),
                    "stats": link_stats(trainer)}, args.out)


if __name__ == "__main__":
    main()
