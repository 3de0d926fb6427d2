"""One benchmark run, configured by a JSON string; rank 0 writes its result to ``cfg["out"]``.

    python benchmarks/worker.py --config '{"kind": "epipe", "model": "mlp", "devices": 2, ...}'

Kinds:

- ``epipe``: ``EPipeStrategy`` (Lightning's launcher re-runs this script once per rank).
- ``ddp``: Lightning's ``strategy="ddp"`` on CPU/gloo, the same global batch split over ranks.
- ``single``: one process, the whole batch, no parallelism (the efficiency baseline).
- ``pipelining``: PyTorch's ``torch.distributed.pipelining`` (``PipelineStage`` +
  ``ScheduleGPipe``, or ``Schedule1F1B`` with ``cfg["schedule"] = "1f1b"``) on gloo;
  :func:`benchmarks.common.run` starts one process per rank.
- ``digits``: the digits example pipelined with EPipeStrategy, then tested (accuracy; also its
  monitor's throughput and each rank's bubble).

``cfg["strategy"]``: further EPipeStrategy keyword arguments (e.g. ``verify_checksum``).
``cfg["trace"]``: a path with ``{rank}``: every rank writes there where its step's time went
(:mod:`benchmarks.tracing`).
``cfg["layers"]``: builder overrides of the model (e.g. ``{"width": 512}``); ``cfg["balance"]``:
layers per stage in pipeline order, the same split for EPipe and torch pipelining.
Throughput is measured on rank 0 from the end of step ``warmup`` to the end of the last step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from collections import Counter
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import lightning as L  # noqa: E402

from benchmarks.models import StackRegressor, build_layers, loader, make_data  # noqa: E402


class StepTimer(L.Callback):
    """Timestamps of every training step's end (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.times.append(time.perf_counter())


class SavedMemory(L.Callback):
    """Per rank: the peak bytes of activations autograd keeps for backward during a training
    step (``torch.autograd.graph.saved_tensors_hooks``, storages counted once, the weights
    that layers also save and the batch itself left out), and the process's peak RSS. What recomputation trades: saved tensors inside a checkpointed stage are not
    kept (recomputed in backward), so they do not count. Rank 0 gathers every rank's pair."""

    def __init__(self) -> None:
        self.live = self.peak = 0
        self._counted: dict[int, int] = {}  # storage pointer -> references alive
        self._hooks = None
        self._weights: set[int] = set()  # storages of parameters and of the batch: saved too, but not activations
        self.ranks: list[dict] = []

    def _pack(self, t: torch.Tensor):
        key = t.untyped_storage().data_ptr()
        if key in self._weights:
            return _Saved(None, key, t)
        if self._counted.get(key, 0) == 0:
            self.live += t.untyped_storage().nbytes()
            self.peak = max(self.peak, self.live)
        self._counted[key] = self._counted.get(key, 0) + 1
        return _Saved(self, key, t)

    def _release(self, key: int, nbytes: int) -> None:
        self._counted[key] -= 1
        if self._counted[key] == 0:
            del self._counted[key]
            self.live -= nbytes

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # the batch is data, not activations: a slice of the in-memory data set (``models.loader``)
        # would otherwise count as its whole storage
        data = [t for t in (batch if isinstance(batch, (list, tuple)) else [batch]) if isinstance(t, torch.Tensor)]
        self._weights = {t.untyped_storage().data_ptr() for t in [*pl_module.parameters(), *data] if not t.is_meta}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda saved: saved.tensor)
        self._hooks.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._hooks.__exit__(None, None, None)

    def on_train_end(self, trainer, pl_module) -> None:
        import resource

        import torch.distributed as dist

        mine = torch.tensor([float(self.peak), float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)])
        rows = [mine]
        if dist.is_initialized():
            rows = [torch.zeros(2) for _ in range(dist.get_world_size())]
            dist.all_gather(rows, mine)
        self.ranks = [{"saved_peak_bytes": r[0].item(), "max_rss_bytes": r[1].item()} for r in rows]


class _Saved:
    """A saved tensor that tells :class:`SavedMemory` when autograd lets go of it."""

    __slots__ = ("owner", "key", "tensor", "nbytes")

    def __init__(self, owner: "SavedMemory | None", key: int, tensor: torch.Tensor) -> None:
        self.owner, self.key, self.tensor = owner, key, tensor
        self.nbytes = tensor.untyped_storage().nbytes()

    def __del__(self) -> None:
        if self.owner is not None:
            self.owner._release(self.key, self.nbytes)


def samples_per_second(times: list[float], warmup: int, batch: int) -> float:
    """Samples/s between the end of step ``warmup`` and the end of the last step."""
    if len(times) <= warmup + 1:
        raise ValueError(f"need more than warmup+1={warmup + 1} steps, got {len(times)}")
    return (len(times) - 1 - warmup) * batch / (times[-1] - times[warmup])


def step_times(times: list[float], warmup: int) -> list[float]:
    """The timed steps' lengths (s): those after step ``warmup``."""
    if len(times) <= warmup + 1:
        raise ValueError(f"need more than warmup+1={warmup + 1} steps, got {len(times)}")
    return [b - a for a, b in zip(times[warmup:], times[warmup + 1:])]


def median_step_rate(times: list[float], warmup: int, batch: int) -> float:
    """Samples/s of the median step after ``warmup``: a step that another job's burst of load
    slowed moves it less than it moves the mean."""
    return batch / statistics.median(step_times(times, warmup))


#: a step of more than this many times its run's median step is a stall: the pipeline stopped
#: for a while, beyond the spread of its steps
STALL = 5


def stalls(times: list[float], warmup: int) -> list[float]:
    """The lengths (ms) of the steps after ``warmup`` longer than ``STALL`` x the median one."""
    steps = step_times(times, warmup)
    median = statistics.median(steps)
    return [1000 * s for s in steps if s > STALL * median]


def rates(times: list[float], warmup: int, batch: int) -> dict:
    """The result's throughput fields: over the whole timed span, of the median step, and the
    stalls among the timed steps (their lengths, ms)."""
    return {"samples_per_s": samples_per_second(times, warmup, batch),
            "median_step_samples_per_s": median_step_rate(times, warmup, batch), "steps": len(times),
            "stalls_ms": stalls(times, warmup)}


def _trainer(cfg: dict, strategy, devices: int, callbacks: list, **extra) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu", devices=devices, strategy=strategy, callbacks=callbacks, logger=False,
        enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
        num_sanity_val_steps=0, **extra,
    )


def _epipe(cfg: dict):
    from lightning_epipe import EPipeStrategy

    codec = dict(cfg.get("codec") or {"compressor": "none"})
    return EPipeStrategy(
        chunks=cfg["chunks"], placement=cfg.get("placement", "chain"), balance=cfg.get("balance"),
        timeout=timedelta(seconds=cfg.get("timeout", 300)), **codec, **cfg.get("strategy", {}),
    )


def run_lightning(cfg: dict) -> dict | None:
    """``epipe``, ``ddp`` or ``single`` on the synthetic stack."""
    from lightning_epipe.callbacks import EPipeMonitor

    layers, shape, target = build_layers(cfg["model"], cfg.get("full", False), **cfg.get("layers", {}))
    kind, devices, batch = cfg["kind"], cfg["devices"], cfg["batch"]
    data = make_data(shape, batch * cfg["steps"], target_shape=target)
    timer = StepTimer()
    if kind == "epipe":  # each replica's client reads its share of every batch
        readers = cfg.get("strategy", {}).get("replicas", 1)
        strategy, monitor = _epipe(cfg), EPipeMonitor()
        callbacks = [timer, monitor]
    elif kind == "ddp":  # each rank reads its share
        strategy, monitor, callbacks, readers = "ddp", None, [timer], devices
    else:
        strategy, monitor, callbacks, readers, devices = "auto", None, [timer], 1, 1
    if batch % readers:
        raise ValueError(f"global batch {batch} does not split over {readers} {kind} readers")
    memory = SavedMemory() if cfg.get("memory") else None
    if memory is not None:
        callbacks.append(memory)
    shard = (int(os.environ.get("LOCAL_RANK", "0")) // (devices // readers), readers)
    trainer = _trainer(cfg, strategy, devices, callbacks, max_epochs=1, log_every_n_steps=10**6,
                       use_distributed_sampler=False)  # each reader takes its shard of every batch itself
    model = StackRegressor(layers)
    if (cfg.get("codec") or {}).get("compressor") == "bottleneck":  # sized and PCA-started on real inputs
        model.example_input_array = data.tensors[0][:batch // cfg["chunks"]]
    trainer.fit(model, loader(data, batch, *shard))
    if not trainer.is_global_zero:
        return None
    result = rates(timer.times, cfg["warmup"], batch)
    if monitor is not None:
        s = monitor.summary()
        kinds = Counter()  # activation, gradient, input (raw inputs/targets sent ahead)
        for link in s["links"].values():
            kinds[link["kind"]] += link["bytes_sent"]
        result.update(ratio=s["ratio"], bytes=s["bytes"], bytes_by_kind=dict(kinds), bubble=s["bubble"],
                      busy={r: v["compute_s"] for r, v in s["ranks"].items()})
        if strategy.auto_choices:
            result["auto"] = strategy.auto_choices
            result["auto_decisions"] = s["auto"]  # step, link, codec, rate and reason of each decision
    if memory is not None:
        result["memory"] = memory.ranks
    return result


def run_digits(cfg: dict) -> dict | None:
    """The digits example over ``devices`` processes with a codec; final test accuracy, the monitor's
    throughput and each rank's bubble."""
    from examples.digits.data import DigitsDataModule
    from examples.digits.model import DigitsClassifier
    from lightning_epipe.callbacks import EPipeMonitor

    L.seed_everything(cfg.get("seed", 0), verbose=False)
    monitor = EPipeMonitor()
    cfg = {**cfg, "placement": cfg.get("placement", "client-server")}
    trainer = _trainer(cfg, _epipe(cfg), cfg["devices"], [monitor], max_epochs=cfg["epochs"], log_every_n_steps=10)
    model, data = DigitsClassifier(), DigitsDataModule(batch_size=cfg.get("batch", 64))
    if cfg["codec"].get("compressor") == "bottleneck":  # sized and PCA-started on real training images
        data.setup("fit")
        model.example_input_array = data.train_set[:256][0]
    trainer.fit(model, data)
    summary = monitor.summary() if trainer.is_global_zero else None
    results = trainer.test(model, data, verbose=False)
    if not trainer.is_global_zero:
        return None
    return {"test_acc": results[0]["test_acc"], "ratio": summary["ratio"], "bytes": summary["bytes"],
            "samples_per_s": summary["throughput_samples_per_s"],
            "bubble": {str(rank): r["bubble"] for rank, r in summary["ranks"].items()}}


def run_pipelining(cfg: dict) -> dict | None:
    """torch.distributed.pipelining, GPipe, uncompressed, one stage per rank (rank 0 first)."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from lightning_epipe.strategy.planning.layer_costs import balance_by_parameters

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if cfg.get("bind_cores"):  # as EPipeStrategy(bind_cores=True) binds its processes, before the process group
        from lightning_epipe.strategy.core_binding import CoreBinding

        CoreBinding().bind(rank, world)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=cfg.get("timeout", 300)))
    try:
        layers, shape, target = build_layers(cfg["model"], cfg.get("full", False), **cfg.get("layers", {}))
        balance = cfg.get("balance") or balance_by_parameters(layers, world, "chain")
        start = sum(balance[:rank])
        module = layers[start:start + balance[rank]]
        batch, chunks = cfg["batch"], cfg["chunks"]
        stage = PipelineStage(module, rank, world, torch.device("cpu"))
        kind = Schedule1F1B if cfg.get("schedule", "gpipe") == "1f1b" else ScheduleGPipe
        schedule = kind(stage, chunks, loss_fn=torch.nn.functional.mse_loss)
        opt = torch.optim.SGD(module.parameters(), lr=1e-3)
        data = make_data(shape, batch * cfg["steps"], target_shape=target)
        times = []
        for step in range(cfg["steps"]):
            x, y = data.tensors[0][step * batch:(step + 1) * batch], data.tensors[1][step * batch:(step + 1) * batch]
            opt.zero_grad()
            if rank == 0:
                schedule.step(x)
            elif rank == world - 1:
                schedule.step(target=y, losses=[])
            else:
                schedule.step()
            opt.step()
            times.append(time.perf_counter())
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return rates(times, cfg["warmup"], batch) if rank == 0 else None


def run_plain(cfg: dict) -> dict:
    """The whole model in one process in a plain loop (no Lightning): what ``single`` costs minus
    Lightning's per-step work. Same data slices, loss and optimizer as ``StackRegressor``, and
    Lightning's order: forward, ``zero_grad``, backward, step (its closure zeroes the gradients
    after the forward). ``cfg["zero_grad"] == "first"``: torch's idiom instead, ``zero_grad``
    before the forward, as the pipelining loop above does it; the allocator then frees the
    gradients before the forward allocates its activations, and the backward allocates them
    anew (at width 2048 that order runs slower: the grid records both)."""
    layers, shape, target = build_layers(cfg["model"], cfg.get("full", False), **cfg.get("layers", {}))
    opt = torch.optim.SGD(layers.parameters(), lr=1e-3)
    batch, zero_first = cfg["batch"], cfg.get("zero_grad", "after_forward") == "first"
    x_all, y_all = make_data(shape, batch * cfg["steps"], target_shape=target).tensors
    times = []
    for step in range(cfg["steps"]):
        x, y = x_all[step * batch:(step + 1) * batch], y_all[step * batch:(step + 1) * batch]
        if zero_first:
            opt.zero_grad()
        out = layers(x)
        if not zero_first:
            opt.zero_grad()
        torch.nn.functional.mse_loss(out, y).backward()
        opt.step()
        times.append(time.perf_counter())
    return rates(times, cfg["warmup"], batch)


KINDS = {"epipe": run_lightning, "ddp": run_lightning, "single": run_lightning,
         "pipelining": run_pipelining, "digits": run_digits, "plain": run_plain}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="JSON: kind, model, devices, batch, chunks, steps, ...")
    cfg = json.loads(parser.parse_args().config)
    torch.set_num_threads(cfg.get("threads", 1))
    if cfg.get("trace"):  # benchmarks/step_trace.py: time the engine's and Lightning's calls in this rank
        from benchmarks.tracing import install

        install(cfg["trace"])
    try:
        result = KINDS[cfg["kind"]](cfg)
    except BaseException as err:  # rank 0 reports the error in the table instead of a result
        if os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) == "0":
            msg = f"{type(err).__name__}: {err}".strip().splitlines()
            Path(cfg["out"]).write_text(json.dumps({"error": msg[0][:300] if msg else type(err).__name__,
                                                    "traceback": traceback.format_exc()[-3000:]}))
        raise
    if result is not None:
        Path(cfg["out"]).write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
