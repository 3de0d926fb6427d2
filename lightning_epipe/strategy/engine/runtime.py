"""Run one rank's share of the pipeline schedule: receive, compute, compress, send.

The :class:`PipelineRuntime` owns this rank's stages, the per-step autograd state and the
codec streams; the strategy calls :meth:`~PipelineRuntime.forward` and
:meth:`~PipelineRuntime.backward` (GPipe) or :meth:`~PipelineRuntime.run_1f1b`, the client
additionally :meth:`~PipelineRuntime.command`. Shape legend: ``B`` batch, ``b`` micro-batch
rows, ``m`` micro-batches.

What keeps the pipeline full:

- the receive of every stream's next message is posted before the current one is
  computed on (``Transport.prepost``), and sends are never waited inside the loop;
- under GPipe the last stage's loss is taken on the whole batch, but the gradient of each
  micro-batch leaves for the stage before as soon as it exists: a hook on the micro-batch's
  received activations (``torch.autograd.graph.register_multi_grad_hook``) sends it from
  inside the loss's backward, in the schedule's order (``m - 1`` down to ``0``);
- every other stage runs a micro-batch's backward as soon as its gradient arrives;
- a stage that sends gradients upstream and is worth it (``split_backward``) computes them
  first and its weights' gradients after: under GPipe once all of the stage's micro-batches
  have sent theirs, under 1F1B right after each send. Such a last stage under GPipe hands
  its outputs out as leaves, where the loss's backward stops, and runs micro-batch by
  micro-batch from their gradients.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import torch
import torch.utils.checkpoint
from torch import Tensor, nn

from lightning_epipe.compressors import BottleneckPair, Compressor, NonFiniteError, Packet, PacketError
from lightning_epipe.compressors.delta import DeltaCompressor
from lightning_epipe.strategy.compression.codec_book import CodecBook
from lightning_epipe.strategy.engine.microbatch import Batch, flatten, input_groups, join, scatter, tensors_of, unflatten
from lightning_epipe.strategy.planning.partition import PipelinePlan
from lightning_epipe.strategy.engine.schedule import Task, rank_tasks, rank_tasks_1f1b, recomputes
from lightning_epipe.strategy.engine.split_backward import WeightPass, input_pass, run_weight_passes, worth_splitting
from lightning_epipe.strategy.engine.stats import LinkKey, PipelineStats
from lightning_epipe.strategy.engine.timing import ComputeTimer
from lightning_epipe.strategy.comm.transport import Transport
from lightning_epipe.strategy.comm.wire import (BARE_BIT, REQUIRES_GRAD_BIT, ClipAlgorithm, Command, Direction, Flag,
                                                Header, Kind, StepFlag, WireError)

__all__ = ["PipelineRuntime", "NonFiniteActivation", "ControlMessage", "INPUT_GROUP_BYTES"]

# Raw inputs (chain placement) cross to the first stage in few messages (``microbatch.input_groups``):
# a batch of at most this many bytes (token ids, small features) as one message per tensor, split
# there; a larger one with micro-batch 0 alone and then groups of 1, 2, 4, ... micro-batches of at
# most this size each, so that the first stage starts after one micro-batch's transfer and every
# message's fixed cost (a gloo rendezvous, the frame, Python on both ends) is paid a few times a
# step instead of once per micro-batch.
INPUT_GROUP_BYTES = 256 * 1024


def _finite(t: Tensor) -> bool:
    """Whether ``t`` holds no NaN/Inf: one read for the sum (non-finite whenever ``t`` is), an
    exact look only when the sum is not finite (a finite tensor whose sum overflows). The sum's
    test runs on the host (``item``): a 0-d ``isfinite`` would cost more than the sum itself."""
    if math.isfinite(t.sum(dtype=torch.float32).item()):
        return True
    return bool(torch.isfinite(t).all())


def _without_autocast(device_type: str, work: Callable[[Any], Any], arg: Any) -> Any:
    """``work(arg)`` with autocast off (a codec's work, in the tensor's own dtype); no context
    where it is already off (twice per message)."""
    if torch.is_autocast_enabled(device_type):
        with torch.autocast(device_type, enabled=False):
            return work(arg)
    return work(arg)


def _detach(y: Any) -> Any:
    """A stage output (Tensor or tuple of Tensors) without its autograd graph."""
    if isinstance(y, Tensor):
        return y.detach()
    return type(y)(_detach(t) for t in y)


class NonFiniteActivation(FloatingPointError):
    """NaN or Inf crossed a cut; ``stage``, ``step`` and ``microbatch`` say where."""

    def __init__(self, message: str, stage: int, step: int, microbatch: int) -> None:
        super().__init__(message)
        self.stage, self.step, self.microbatch = stage, step, microbatch


@dataclass(frozen=True)
class ControlMessage:
    command: Command
    step: int
    num_microbatches: int = 0
    arg: int = 0
    flags: int = 0
    clip: Optional[tuple[ClipAlgorithm, float]] = None  # CLIP_GRADIENTS: how and by what


@dataclass
class _Saved:
    """Autograd state of one (stage, micro-batch) kept from forward to backward."""

    leaves: list[Tensor]  # received tensors that require grad, in message order
    outputs: list[Tensor] = field(default_factory=list)  # sent tensors that require grad
    handed: list[tuple[Tensor, Tensor]] = field(default_factory=list)  # GPipe's last stage: (output, leaf handed out)
    split: bool = False  # its backward computes the input gradients first (split_backward)


def _hand_out(y: Any, handed: list[tuple[Tensor, Tensor]]) -> Any:
    """The last stage's output ``y`` (a Tensor, or a tuple/list/dict of them) with every tensor
    that requires grad replaced by a leaf of its values; ``handed`` gets each (tensor, leaf)."""
    if isinstance(y, Tensor):
        if not y.requires_grad:
            return y
        leaf = y.detach().requires_grad_()
        handed.append((y, leaf))
        return leaf
    if isinstance(y, dict):
        return {k: _hand_out(v, handed) for k, v in y.items()}
    if isinstance(y, (tuple, list)):
        values = [_hand_out(v, handed) for v in y]
        return type(y)(*values) if hasattr(y, "_fields") else type(y)(values)
    return y


class PipelineRuntime:
    """This rank's stages and the loop over its GPipe tasks.

    Example (inside an initialized process group, rank ``r`` of a 3-process pipeline)::

        plan = plan_pipeline(num_layers=len(seq), num_ranks=3, balance=[1, 2, 2, 1])
        runtime = PipelineRuntime(plan, r, seq, transport, codecs, PipelineStats())
        outs = runtime.forward(scatter(x, 4))   # client: list of m outputs (leaves)
        loss(gather(outs)).backward(); runtime.backward()
    """

    def __init__(
        self,
        plan: PipelinePlan,
        rank: int,
        layers: nn.Sequential,
        transport: Transport,
        codecs: CodecBook,
        stats: PipelineStats,
        nonfinite: str = "raise",
        checkpoint: str = "never",
        bottlenecks: Optional[dict[int, BottleneckPair]] = None,
        split_backward: Union[bool, str] = "auto",
    ) -> None:
        self.plan = plan
        self.rank = rank
        self.stage_ids = plan.stages_of(rank)
        pairs = bottlenecks or {}
        self.stages = {s: self._stage_module(s, layers, pairs) for s in self.stage_ids}
        # bytes the first tensor at a bottleneck cut would take without it, per byte of code
        self._expansion = {c: pair.expansion for c, pair in pairs.items()}
        self.transport = transport
        self.codecs = codecs
        self.stats = stats
        self.timer = ComputeTimer(stats, transport.device)
        self.nonfinite = nonfinite  # "raise" | "skip" | "allow"
        self.nonfinite_seen = False  # this step sent NaN/Inf (nonfinite="skip")
        self.checkpoint = checkpoint  # "always" | "except_last" | "never"
        self.split_backward = split_backward  # True | False | "auto" (split_backward.worth_splitting)
        self._worth_splitting: dict[tuple[int, bool, tuple], bool] = {}  # (stage, 1F1B, input shapes) -> the answer
        self._split_step: dict[int, bool] = {}  # stage -> whether this step splits its backward
        self.step = 0
        self.started_ahead = False  # server: this step's forward ran before Lightning's step (server_loop.start_next_step)
        self._paused: Optional[tuple[list[Task], int, dict[int, Any]]] = None  # 1F1B: (tasks, next, outputs) to resume
        self.num_microbatches = 0
        self.microbatches_run = 0  # micro-batches of every step begun so far (auto's compute per micro-batch)
        self.samples: dict[tuple[str, int], Tensor] = {}  # (direction, cut) -> last tensor sent on an auto link
        self.sample_ids: Optional[list[Tensor]] = None  # [b] dataset indices per micro-batch (delta compression)
        self.num_samples = 0
        self._saved: dict[tuple[int, int], _Saved] = {}
        self._tensors_per_microbatch: dict[tuple[int, int], int] = {}  # (kind, peer) -> as in its last message
        self._one_f_one_b = False  # the current step runs as 1F1B (backward order ascending)
        self._weight_passes: dict[int, list[WeightPass]] = {}  # stage -> its weight passes still to run
        self._hooked: dict[int, list[Optional[Tensor]]] = {}  # GPipe: last-stage input gradients autograd produced
        self._hook_handles: list[Any] = []
        self._next_hooked = -1  # GPipe: the next micro-batch whose last-stage gradients go upstream
        self._input_layout_sent: Optional[dict] = None  # chain placement: the raw inputs' structure, as last sent
        self._input_layout: Optional[dict] = None  # ... and as last received
        self.input_group_bytes = INPUT_GROUP_BYTES
        self._grouped_inputs: dict[int, Batch] = {}  # first stage: micro-batches that came in an earlier one's message
        # (stream kind, peer) of the streams only one of this rank's stages reads: their
        # messages come in that stage's order, so a phase's receives may be posted at once
        read = [(k, peer) for kind in (Kind.ACTIVATION, Kind.GRADIENT) for _, peer, k in self._sources(kind)]
        self._one_reader = {stream for stream in read if read.count(stream) == 1}

    def _stage_module(self, s: int, layers: nn.Sequential, pairs: dict[int, BottleneckPair]) -> nn.Sequential:
        """Stage ``s``'s layers, after the decoder of the cut before it and before the encoder of the cut after it."""
        modules = [layers[i] for i in range(*self.plan.bounds[s])]
        if s - 1 in pairs:
            modules.insert(0, pairs[s - 1].decoder)
        if s in pairs:
            modules.append(pairs[s].encoder)
        return nn.Sequential(*modules)

    def _raw_bytes(self, cut: int, j: int, t: Tensor) -> int:
        """What tensor ``j`` crossing ``cut`` would take uncompressed (before a bottleneck)."""
        nbytes = t.numel() * t.element_size()
        return round(nbytes * self._expansion[cut]) if j == 0 and cut in self._expansion else nbytes

    @property
    def last_stage(self) -> int:
        return self.plan.num_stages - 1

    @property
    def has_pending_backward(self) -> bool:
        return bool(self._saved)

    @property
    def open_ends(self) -> tuple[int, int]:
        """(autograd states: micro-batches not backpropagated, hooks, weight passes not run;
        sends) the current step still holds; both 0 once it has closed."""
        pending = len(self._saved) + len(self._hook_handles) + sum(len(p) for p in self._weight_passes.values())
        return pending, self.transport.sends_in_flight

    # ------------------------------------------------------------------ control (client -> servers)

    def command(self, command: Command, num_microbatches: int = 0, arg: int = 0, flags: int = 0) -> None:
        """Client only: tell every server what to do next."""
        for peer in range(1, self.plan.num_ranks):
            self.transport.send(peer, Header.command(command, self.step, num_microbatches, flags, optimizer=arg))

    def clip_command(self, optimizer: int, algorithm: ClipAlgorithm, value: float) -> None:
        """Client only: every server clips optimizer ``optimizer``'s gradients as this rank does."""
        for peer in range(1, self.plan.num_ranks):
            self.transport.send(peer, Header.clip(self.step, optimizer, algorithm, value))

    def next_command(self) -> ControlMessage:
        """Server only: wait for the client's next command."""
        got = self.transport.recv(0, f"the client's next command after step {self.step}", idle=True, kind=Kind.CONTROL)
        h = got.header
        if h.arg not in Command._value2member_map_:
            raise WireError(f"{self.transport.link(0, False)}: unknown command {h.arg}")
        command = Command(h.arg)
        if command == Command.FORWARD and h.flags & StepFlag.SAMPLE_IDS:
            self.transport.prepost(0, Kind.SAMPLES)  # they follow
        expected = self.step + 1 if command == Command.FORWARD else self.step
        if h.step != expected:
            raise WireError(
                f"{self.transport.link(0, False)}: {command.name} for step {h.step} but this rank is at step"
                f" {self.step}: the ranks ran a different number of steps (do all of them see the same number of batches?)"
            )
        clip = h.clip_args(self.transport.link(0, False)) if command == Command.CLIP_GRADIENTS else None
        return ControlMessage(command, h.step, h.num_microbatches, h.microbatch, h.flags, clip)

    def commands_arrived(self, count: int) -> list[tuple[Command, int]]:
        """Server only: the client's next ``count`` commands, as many as have arrived, left
        unread (never waits); with their step flags: ``[(command, flags), ...]``."""
        arrived = []
        for h in self.transport.commands_arrived(0, count):
            if h.arg not in Command._value2member_map_:
                break  # next_command names it
            arrived.append((Command(h.arg), h.flags))
        return arrived

    # ------------------------------------------------------------------ forward

    def send_sample_ids(self, ids: Tensor, num_samples: int) -> None:
        """Client only: tell every server which dataset samples this step's batch holds (ids [B] int64)."""
        payload = ids.to(device=self.transport.device, dtype=torch.int64).contiguous().view(torch.uint8)
        for peer in range(1, self.plan.num_ranks):
            self.transport.send(peer, Header.sample_ids(self.step, self.num_microbatches, num_samples), payload)

    def recv_sample_ids(self) -> tuple[Tensor, int]:
        """Server only: the ids [B] the client sent for this step, and the training set's size."""
        got = self.transport.recv(0, f"sample ids of step {self.step}", kind=Kind.SAMPLES, step=self.step)
        if got.payload is None or got.payload.numel() % 8:
            raise WireError(f"{self.transport.link(0, False)}: sample ids of step {self.step}: payload is not int64")
        return got.payload.view(torch.int64).clone(), got.header.arg

    def begin_step(self, num_microbatches: int, sample_ids: Optional[list[Tensor]] = None, num_samples: int = 0) -> None:
        """Start a step of ``num_microbatches``; ``sample_ids``: the [b] dataset indices of each
        micro-batch's rows when activations are delta-compressed (training only)."""
        if self._saved:
            raise RuntimeError(
                "a new pipeline forward started while the previous one still waits for its backward: call the"
                " pipelined Sequential once per step, and backward the loss that depends on it"
            )
        if sample_ids is not None and len(sample_ids) != num_microbatches:
            raise RuntimeError(f"{len(sample_ids)} lists of sample ids for {num_microbatches} micro-batches")
        self.step += 1
        self.num_microbatches = num_microbatches
        self.microbatches_run += num_microbatches
        self.sample_ids, self.num_samples = sample_ids, num_samples
        self.nonfinite_seen = False
        self._grouped_inputs.clear()
        self._split_step.clear()

    def forward(self, microbatches: Optional[list[Batch]] = None) -> Optional[list[Any]]:
        """Run this rank's forward tasks for the current step (GPipe: backward comes later).

        Args:
            microbatches: on the client, the ``m`` micro-batch inputs ([b, ...] each).
        Returns:
            On the rank of the last stage, its ``m`` outputs; elsewhere ``None``.
        """
        grad = torch.is_grad_enabled()
        self._one_f_one_b = False
        self._prepost_phase(Kind.ACTIVATION, range(self.num_microbatches))
        self._send_inputs(microbatches)
        outputs: dict[int, Any] = {}
        for task in rank_tasks(self.stage_ids, self.num_microbatches, "forward"):
            self._forward_task(task.stage, task.microbatch, microbatches, grad, outputs)
        if grad:
            self._next_hooked = self.num_microbatches - 1
        self.timer.settle()
        self.transport.flush()
        return self._outputs(outputs)

    def _sources(self, kind: Kind) -> list[tuple[int, int, Kind]]:
        """``(stage, peer, stream kind)`` of every stream this rank reads ``kind`` messages from
        (the first stage away from the client reads its activations' inputs as ``INPUT``)."""
        sources = []
        for s in self.stage_ids:
            if kind == Kind.ACTIVATION and s > 0:
                sources.append((s, self.plan.stage_ranks[s - 1], kind))
            elif kind == Kind.ACTIVATION and self.rank != 0:
                sources.append((s, 0, Kind.INPUT))
            elif kind == Kind.GRADIENT and s < self.last_stage:
                sources.append((s, self.plan.stage_ranks[s + 1], kind))
        return sources

    def _prepost_first(self, kind: Kind, microbatch: int) -> None:
        """Post the first receive of every stream this rank reads ``kind`` messages from."""
        for _, peer, stream_kind in self._sources(kind):
            self.transport.prepost(peer, stream_kind, microbatch)

    def _prepost_phase(self, kind: Kind, order: range) -> None:
        """Post the receives of this phase's ``kind`` messages (``order``: their micro-batches as
        they come): the first on every stream, and where a stream carries one tensor per
        micro-batch to one stage of this rank all the others behind it at once
        (``Transport.prepost``'s ``behind``, on gloo), so that every message is written as soon
        as its sender sends it. One tensor: a
        gradient stream's as the saved outputs say (GPipe's backward), an activation stream's as
        its last message said (its stage's output structure is the same at every step)."""
        self._prepost_first(kind, order[0])
        for s, peer, stream_kind in self._sources(kind):
            if (stream_kind, peer) not in self._one_reader:
                continue  # two stages on one stream: their messages come in turn
            if stream_kind == Kind.ACTIVATION:
                one = self._tensors_per_microbatch.get((kind, peer)) == 1
            elif stream_kind == Kind.GRADIENT and not self._one_f_one_b:
                one = all((s, i) in self._saved and len(self._saved[(s, i)].outputs) == 1 for i in order)
            else:
                continue
            if one:
                for i in order[1:]:
                    self.transport.prepost(peer, kind, i, behind=True)

    def _prepost_gradients_of(self, s: int, i: int, count: int) -> None:
        """1F1B: post the receives of micro-batch ``i``'s ``count`` gradients into stage ``s`` once
        its forward has said how many there are, behind those already posted (gloo). Its
        stream carries them in this rank's forward order, unless another stage of this rank
        reads gradients from the same peer (their order is then the peer's backward order)."""
        peer = self.plan.stage_ranks[s + 1]
        if (Kind.GRADIENT, peer) not in self._one_reader:
            return
        for j in range(count):
            self.transport.prepost(peer, Kind.GRADIENT, i, j, behind=True)

    def run_1f1b(self, microbatches: Optional[list[Batch]] = None,
                 loss_of: Optional[Callable[[int, Any], Tensor]] = None, until_backward: bool = False) -> Optional[list[Any]]:
        """A whole training step under 1F1B: forwards and backwards interleaved.

        On the rank of the last stage, ``loss_of(i, y_i)`` is micro-batch ``i``'s loss (already
        weighted), backpropagated as soon as its forward ends. Parameter gradients accumulate
        as usual. Returns the last stage's ``m`` outputs, detached, there; elsewhere ``None``.
        ``until_backward`` (a server starting the step ahead, ``server_loop.start_next_step``):
        stop before this rank's first backward task, which waits for a gradient anyway;
        :meth:`resume_1f1b` runs the rest.
        """
        order = rank_tasks_1f1b(self.plan.stage_ranks, self.num_microbatches)
        self._one_f_one_b = True
        self._prepost_phase(Kind.ACTIVATION, range(self.num_microbatches))
        self._prepost_first(Kind.GRADIENT, 0)
        self._send_inputs(microbatches)
        return self._run_1f1b_tasks(order[self.rank], 0, {}, microbatches, loss_of, until_backward)

    @property
    def paused_1f1b(self) -> bool:
        """Whether a 1F1B step stopped before its first backward task (``run_1f1b(until_backward=True)``)."""
        return self._paused is not None

    def resume_1f1b(self) -> None:
        """Run the rest of the 1F1B step that ``run_1f1b(until_backward=True)`` stopped (a server's)."""
        tasks, start, outputs = self._paused
        self._paused = None
        self._run_1f1b_tasks(tasks, start, outputs, None, None, False)

    def _run_1f1b_tasks(self, tasks: list[Task], start: int, outputs: dict[int, Any], microbatches: Optional[list[Batch]],
                        loss_of: Optional[Callable[[int, Any], Tensor]], until_backward: bool) -> Optional[list[Any]]:
        """This rank's 1F1B ``tasks`` from index ``start`` on (see :meth:`run_1f1b`)."""
        for k in range(start, len(tasks)):
            task = tasks[k]
            if until_backward and task.phase != "forward":
                self._paused = (tasks, k, outputs)
                return None
            s, i = task.stage, task.microbatch
            if task.phase == "forward":
                self._forward_task(s, i, microbatches, True, outputs)
            elif s == self.last_stage:
                self._backward_task(s, i, loss=loss_of(i, outputs[i]))
                outputs[i] = _detach(outputs[i])  # its graph is spent; keep only the values
            else:
                self._backward_task(s, i)
        self.timer.settle()
        self.transport.flush()
        return self._outputs(outputs)

    def _send_inputs(self, microbatches: Optional[list[Batch]]) -> None:
        """Chain placement: the client sends the raw inputs to the first stage, micro-batches
        grouped into few messages (``input_groups`` of at most ``input_group_bytes``)."""
        if self.rank != 0 or self.plan.input_rank == 0:
            return
        sizes = [sum(t.numel() * t.element_size() for t in tensors_of(mb)) for mb in microbatches]
        for group in input_groups(sizes, self.input_group_bytes):
            mb = microbatches[group.start] if len(group) == 1 else join(microbatches[group.start:group.stop])
            self._send_input(mb, group.start, len(group))

    def _outputs(self, outputs: dict[int, Any]) -> Optional[list[Any]]:
        if self.last_stage in self.stage_ids:
            return [outputs[i] for i in range(self.num_microbatches)]
        return None

    def _forward_task(self, s: int, i: int, microbatches: Optional[list[Batch]], grad: bool, outputs: dict[int, Any]) -> None:
        """Stage ``s`` on micro-batch ``i``: receive (or take) its input, run, send or keep the output."""
        leaves: list[Tensor] = []
        if s == 0:
            x = microbatches[i] if self.rank == 0 else self._recv_input(i)
        else:
            tensors, bare = self._recv(Kind.ACTIVATION, self.plan.stage_ranks[s - 1], s - 1, i, grad)
            leaves = [t for t in tensors if t.requires_grad]
            x = unflatten(tensors, bare)
        recomputed = grad and recomputes(self.checkpoint, i, self.num_microbatches)
        step_splits = bool(leaves) and self._splits(s, x, leaves)
        split = step_splits and not recomputed  # a recomputed micro-batch's backward runs whole
        with self.timer.measure(s):
            if recomputed:
                y = torch.utils.checkpoint.checkpoint(self.stages[s], x, use_reentrant=False)
            else:
                y = self.stages[s](x)
        if s == self.last_stage:
            outputs[i] = y
            if grad:
                saved = self._saved[(s, i)] = _Saved(leaves, split=split)
                if self._one_f_one_b:
                    pass
                elif step_splits:  # the loss's backward stops at the leaves handed out
                    outputs[i] = _hand_out(y, saved.handed)
                elif leaves:  # the loss's backward runs the stage: the gradients leave from a hook
                    self._hook_handles.append(torch.autograd.graph.register_multi_grad_hook(
                        leaves, lambda grads, i=i: self._on_last_stage_grads(i, grads), mode="all"))
            return
        ys, bare = flatten(y)
        self._send(Kind.ACTIVATION, self.plan.stage_ranks[s + 1], s, i, ys, bare)
        if grad:
            outs = [t for t in ys if t.requires_grad and t.is_floating_point()]
            saved = self._saved[(s, i)] = _Saved(leaves, outs, split=split)
            if self._one_f_one_b:
                self._prepost_gradients_of(s, i, len(saved.outputs))

    def _splits(self, s: int, x: Any, leaves: list[Tensor]) -> bool:
        """Whether stage ``s`` splits its backward this step (decided at its first micro-batch,
        once per input shape: ``split_backward.worth_splitting``)."""
        if s not in self._split_step:
            key = (s, self._one_f_one_b, tuple((tuple(t.shape), t.dtype) for t in leaves))
            if key not in self._worth_splitting:
                self._worth_splitting[key] = worth_splitting(self.stages[s], x, self.transport.device, self.split_backward,
                                                             self._one_f_one_b)
            self._split_step[s] = self._worth_splitting[key]
        return self._split_step[s]

    # ------------------------------------------------------------------ backward

    def backward(self) -> None:
        """Run this rank's backward tasks; the client calls it after ``loss.backward()``, whose
        hooks may already have sent every gradient of the last stage, or which left them in
        the leaves that stage handed out (split); under 1F1B only the step's sends remain to
        be closed. Each stage's weight passes run once its last task has sent its gradients."""
        if self._saved:
            self.prepost_gradients()
            tasks = rank_tasks(self.stage_ids, self.num_microbatches, "backward")
            for k, task in enumerate(tasks):
                self._backward_task(task.stage, task.microbatch)
                if k + 1 == len(tasks) or tasks[k + 1].stage != task.stage:
                    self._run_weight_passes(task.stage)
        self._remove_hooks()
        self.timer.settle()
        self.transport.flush()

    def _run_weight_passes(self, s: int) -> None:
        """Stage ``s``'s weight passes left by its backward tasks (``split_backward``), in one go."""
        passes = self._weight_passes.pop(s, None)
        if passes:
            with self.timer.measure(s):
                run_weight_passes(passes)

    def prepost_gradients(self) -> None:
        """GPipe, once the step's backward is certain to run: post the receives of its gradients
        (the client before its last stage's backward, whose gradients the servers answer)."""
        if self._saved and not self._one_f_one_b:
            self._prepost_phase(Kind.GRADIENT, range(self.num_microbatches - 1, -1, -1))

    def _on_last_stage_grads(self, i: int, grads: Any) -> None:
        """Autograd hook (GPipe): micro-batch ``i``'s gradients w.r.t. the last stage's received
        activations exist; send every micro-batch whose turn has come, in the schedule's order."""
        self._hooked[i] = list(grads)
        while self._next_hooked in self._hooked:
            mb = self._next_hooked
            saved = self._saved.pop((self.last_stage, mb), None)
            if saved is not None:
                self._send_grads(self.plan.stage_ranks[self.last_stage - 1], self.last_stage - 1, mb, saved.leaves,
                                 self._hooked[mb])
            del self._hooked[mb]
            self._next_hooked -= 1

    def _remove_hooks(self) -> None:
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles.clear()
        self._hooked.clear()

    def _backward_task(self, s: int, i: int, loss: Optional[Tensor] = None) -> None:
        """Backpropagate stage ``s`` for micro-batch ``i`` (the last stage from ``loss``, if given,
        else from the gradients of the leaves it handed out, or, where hooks caught them inside
        the loss's backward, from nothing: only what they have not sent) and send its input
        gradients upstream; where the stage splits its backward (``split_backward.input_pass``),
        before the weights' gradients: those follow at once under 1F1B, after the stage's last
        task under GPipe."""
        saved = self._saved.pop((s, i), None)
        if saved is None:
            return
        if loss is not None:
            pairs: list[tuple[Tensor, Optional[Tensor]]] = [(loss, None)]
        elif s == self.last_stage:
            pairs = [(y, leaf.grad) for y, leaf in saved.handed if leaf.grad is not None]
        else:
            grads = self._recv_grads(self.plan.stage_ranks[s + 1], s, i, len(saved.outputs))
            pairs = [(o, g) for o, g in zip(saved.outputs, grads) if g is not None]
        split = None
        if pairs:
            outs, grads = [o for o, _ in pairs], [g for _, g in pairs]
            with self.timer.measure(s):
                if saved.split:
                    split = input_pass(outs, grads, saved.leaves)
                if split is None:
                    torch.autograd.backward(outs, grads)
        if s == 0:
            return
        if s == self.last_stage and loss is None and not saved.handed:  # hooks: those they caught, or none
            self._send_grads(self.plan.stage_ranks[s - 1], s - 1, i, saved.leaves, self._hooked.pop(i, None))
            self._next_hooked = i - 1
            return
        self._send_grads(self.plan.stage_ranks[s - 1], s - 1, i, saved.leaves, None if split is None else split[0])
        if split is not None:
            self._weight_passes.setdefault(s, []).append(split[1])
            if self._one_f_one_b:  # at once: 1F1B holds few micro-batches' activations
                self._run_weight_passes(s)

    def discard(self) -> None:
        """Drop the autograd state of a step that will not be backpropagated."""
        self._saved.clear()
        self._paused = None
        self._weight_passes.clear()
        self._remove_hooks()

    # ------------------------------------------------------------------ messages

    def _send(self, kind: Kind, peer: int, cut: int, mb: int, tensors: list[Tensor], bare: bool) -> None:
        n = len(tensors)
        for j, t in enumerate(tensors):
            flags = BARE_BIT if (bare and j == 0) else 0
            if kind == Kind.ACTIVATION and t.requires_grad and t.is_floating_point():
                flags |= REQUIRES_GRAD_BIT
            self._send_one(kind, peer, cut, mb, j, n, t.detach(), flags)

    def _send_one(self, kind: Kind, peer: int, cut: int, mb: int, j: int, n: int, t: Tensor, flags: int,
                  group: int = 0) -> None:
        """Send tensor ``j`` of the ``n`` that micro-batch ``mb`` carries on ``kind``'s stream to
        ``peer``: probe, encode, frame, post (an input message: of the ``group`` micro-batches
        from ``mb`` on, joined)."""
        direction = Direction.GRADIENT if kind == Kind.GRADIENT else Direction.ACTIVATION
        codec = self.codecs.raw if kind == Kind.INPUT else self._bound(self.codecs.get(direction, cut, mb, j, t), mb)
        if kind != Kind.INPUT and j == 0 and t.is_floating_point() and self.codecs.is_auto(direction, cut):
            self.samples[(direction, cut)] = t  # what compressor="auto" profiles the codecs on
        # under a GradScaler ("allow") NaN/Inf only switch the codec to raw: no probe (a host sync on
        # an accelerator) where the codec sends the tensor's own bytes already
        probe = self.nonfinite != "allow" or codec.codec_id != self.codecs.raw.codec_id
        if kind != Kind.INPUT and t.is_floating_point() and probe and not _finite(t):  # the streams' codecs do not check
            codec = self._on_nonfinite(kind, cut, mb, t)
            flags |= Flag.NONFINITE
        try:  # codecs compute in the tensor's own dtype
            packet = _without_autocast(t.device.type, codec.encode, t)
        except NonFiniteError as error:  # a cast past its wire dtype's range (fp16): Inf on the wire
            codec = self._on_nonfinite(kind, cut, mb, t, str(error))
            flags |= Flag.NONFINITE
            packet = _without_autocast(t.device.type, codec.encode, t)
        header = Header.data(kind, self.step, mb, self.num_microbatches, j, n, flags, group)
        nbytes = self.transport.send(peer, header, packet.payload, prefix=packet.header())
        raw = t.numel() * t.element_size() if kind == Kind.INPUT else self._raw_bytes(cut, j, t)
        self.stats.link(LinkKey("send", peer, Direction.of(kind))).add(nbytes, raw)

    def _bound(self, codec: Compressor, mb: int) -> Compressor:
        """A delta codec learns the sample ids of micro-batch ``mb`` (``None`` outside training)."""
        if isinstance(codec, DeltaCompressor):
            codec.bind(None if self.sample_ids is None else self.sample_ids[mb], self.num_samples)
        return codec

    def _on_nonfinite(self, kind: Kind, cut: int, mb: int, t: Tensor, overflow: Optional[str] = None):
        """Raise, or (``nonfinite="skip"``) mark the step and send the values raw so NaN stays NaN;
        under a GradScaler (``"allow"``) send them raw: the scaler skips the step on every rank.
        ``overflow``: the codec's message where ``t`` is finite but its cast would not be."""
        if self.nonfinite == "allow":
            return self.codecs.raw
        stage = cut if kind == Kind.ACTIVATION else cut + 1
        what = f"values past the codec's range ({overflow})" if overflow else f"{int((~torch.isfinite(t)).sum())} NaN/Inf values"
        where = f"{what} in the {Direction.of(kind)} leaving stage {stage} (rank {self.rank}) at step {self.step}, micro-batch {mb}"
        if self.nonfinite == "raise":
            raise NonFiniteActivation(
                f"{where}. Lower the learning rate, clip gradients or check the inputs; or pass"
                " EPipeStrategy(nonfinite='skip') to skip such steps",
                stage,
                self.step,
                mb,
            )
        if not self.nonfinite_seen:
            warnings.warn(f"{where}: the step will be skipped on every rank", RuntimeWarning, stacklevel=2)
        self.nonfinite_seen = True
        return self.codecs.raw

    def _recv(self, kind: Kind, peer: int, cut: int, mb: int, grad: bool) -> tuple[list[Tensor], bool]:
        what = f"{Direction.of(kind)} of step {self.step}, micro-batch {mb}"
        tensors, bare, count, j = [], False, 1, 0
        while j < count:
            got = self.transport.recv(peer, what, kind=kind, step=self.step, microbatch=mb, index=j)
            h = got.header
            if j == 0:
                count, bare = h.count, bool(h.flags & BARE_BIT)
                self._tensors_per_microbatch[(kind, peer)] = count
            elif h.count != count:
                raise WireError(f"{self.transport.link(peer, False)}: {what}: message count changed from {count} to {h.count}")
            self._prepost_next(peer, kind, mb, j, count, 1)
            t = self._decode(got.payload, Direction.ACTIVATION, cut, mb, j, peer, what)
            self.stats.link(LinkKey("recv", peer, Direction.of(kind))).add(got.nbytes, self._raw_bytes(cut, j, t))
            if grad and h.flags & REQUIRES_GRAD_BIT:
                t = t.detach().requires_grad_()
            tensors.append(t)
            j += 1
        return tensors, bare

    def _decode(self, payload: Optional[Tensor], direction: Direction, cut: int, mb: int, j: int, peer: int, what: str) -> Tensor:
        link = self.transport.link(peer, False)
        if payload is None:
            raise WireError(f"{link}: {what}: message {j} has no payload")
        try:
            packet = Packet.from_bytes(payload, owned=True)  # every received frame is fresh memory
            decoder = self._bound(self.codecs.decoder(direction, cut, mb, j, packet.codec), mb)
            return _without_autocast(payload.device.type, decoder.decode, packet)
        except PacketError as err:
            raise WireError(f"{link}: {what}: message {j}: {err}") from err

    def _prepost_next(self, peer: int, kind: Kind, mb: int, j: int, count: int, step: int) -> None:
        """Post the receive of the message after ``(mb, j)`` on its stream: the next tensor of the
        micro-batch, else the first of micro-batch ``mb + step`` if the step has one."""
        if j + 1 < count:
            self.transport.prepost(peer, kind, mb, j + 1)
        elif 0 <= mb + step < self.num_microbatches:
            self.transport.prepost(peer, kind, mb + step)
        elif kind == Kind.INPUT and self.transport.tags_apart:  # the next step's first (gloo): it may come
            self.transport.prepost(peer, kind, 0)  # while this rank is still in this step's backward

    def _send_grads(self, peer: int, cut: int, mb: int, leaves: list[Tensor],
                    grads: Optional[list[Optional[Tensor]]] = None) -> None:
        """Send the gradients of ``leaves`` (``grads`` where a hook caught them, else their ``.grad``)."""
        n = len(leaves)
        for j, leaf in enumerate(leaves):
            grad = leaf.grad if grads is None else grads[j]
            if grad is None:
                header = Header.data(Kind.GRADIENT, self.step, mb, self.num_microbatches, j, n, Flag.NO_GRAD)
                nbytes = self.transport.send(peer, header)
                self.stats.link(LinkKey("send", peer, Direction.GRADIENT)).add(nbytes, 0)
            else:
                self._send_one(Kind.GRADIENT, peer, cut, mb, j, n, grad, Flag.NONE)
            leaf.grad = None

    def _recv_grads(self, peer: int, cut: int, mb: int, expected: int) -> list[Optional[Tensor]]:
        what = f"gradient of step {self.step}, micro-batch {mb}"
        grads: list[Optional[Tensor]] = []
        for j in range(expected):
            got = self.transport.recv(peer, what, kind=Kind.GRADIENT, step=self.step, microbatch=mb, index=j, count=expected)
            self._prepost_next(peer, Kind.GRADIENT, mb, j, expected, 1 if self._one_f_one_b else -1)
            if got.header.flags & Flag.NO_GRAD:
                grads.append(None)
                self.stats.link(LinkKey("recv", peer, Direction.GRADIENT)).add(got.nbytes, 0)
                continue
            g = self._decode(got.payload, Direction.GRADIENT, cut, mb, j, peer, what)
            self.stats.link(LinkKey("recv", peer, Direction.GRADIENT)).add(got.nbytes, self._raw_bytes(cut, j, g))
            grads.append(g)
        return grads

    # ------------------------------------------------------------------ raw inputs (chain placement)

    def _send_input(self, mb: Batch, i: int, group: int) -> None:
        """The raw inputs of micro-batches ``i .. i + group - 1`` (joined in ``mb``) to the first
        stage: one message per tensor, led by a ``LAYOUT`` message (its structure as JSON) only
        when the structure changed."""
        peer = self.plan.input_rank
        tensors = tensors_of(mb)
        if isinstance(mb, Tensor):
            layout = {"type": "tensor", "count": 1}
        elif isinstance(mb, dict):
            layout = {"type": "dict", "keys": list(mb), "count": len(mb)}
        else:
            layout = {"type": type(mb).__name__, "count": len(mb)}
        lead = int(layout != self._input_layout_sent)
        n = len(tensors) + lead
        if lead:
            meta = torch.frombuffer(bytearray(json.dumps(layout).encode()), dtype=torch.uint8)
            header = Header.data(Kind.INPUT, self.step, i, self.num_microbatches, 0, n, Flag.LAYOUT, group)
            nbytes = self.transport.send(peer, header, meta)
            self.stats.link(LinkKey("send", peer, Direction.INPUT)).add(nbytes, 0)
            self._input_layout_sent = layout
        for j, t in enumerate(tensors, start=lead):
            self._send_one(Kind.INPUT, peer, 0, i, j, n, t.detach(), 0, group)

    def _recv_input(self, i: int) -> Batch:
        """Micro-batch ``i``'s raw inputs: from the message that held it with the ones before it,
        or from the next message, which holds ``arg`` micro-batches from ``i`` on."""
        if i in self._grouped_inputs:
            return self._grouped_inputs.pop(i)
        what = f"input of step {self.step}, micro-batch {i}"
        link = self.transport.link(0, False)
        got = self.transport.recv(0, what, kind=Kind.INPUT, step=self.step, microbatch=i, index=0)
        count, group = got.header.count, got.header.arg
        if not 1 <= group <= self.num_microbatches - i:
            raise WireError(f"{link}: {what}: a message of {group} micro-batches from micro-batch {i}"
                            f" of {self.num_microbatches}")
        self._prepost_next(0, Kind.INPUT, i, 0, count, group)
        messages = [got]
        if got.header.flags & Flag.LAYOUT:
            self.stats.link(LinkKey("recv", 0, Direction.INPUT)).add(got.nbytes, 0)
            try:
                self._input_layout = json.loads(bytes(got.payload.cpu().numpy()).decode())
            except (ValueError, AttributeError) as err:
                raise WireError(f"{link}: {what}: unreadable input layout") from err
            messages = []
        layout = self._input_layout
        if layout is None or layout.get("count") != count - (1 - len(messages)):
            raise WireError(f"{link}: {what}: {count} messages do not match the input layout {layout}")
        for j in range(1, count):
            messages.append(self.transport.recv(0, what, kind=Kind.INPUT, step=self.step, microbatch=i, index=j, arg=group))
            self._prepost_next(0, Kind.INPUT, i, j, count, group)
        tensors = []
        for j, msg in enumerate(messages, start=count - len(messages)):
            t = self._decode(msg.payload, Direction.ACTIVATION, 0, i, j, 0, what)
            self.stats.link(LinkKey("recv", 0, Direction.INPUT)).add(msg.nbytes, t.numel() * t.element_size())
            tensors.append(t)
        batch = _input_batch(layout, tensors)
        if group == 1:
            return batch
        parts = scatter(batch, group)
        if len(parts) != group:
            raise WireError(f"{link}: {what}: a message of {group} micro-batches holds {len(parts)} rows")
        self._grouped_inputs.update(zip(range(i + 1, i + group), parts[1:]))
        return parts[0]


def _input_batch(layout: dict, tensors: list[Tensor]) -> Batch:
    """Raw input tensors put back into the structure ``layout`` describes."""
    kind = layout.get("type")
    if kind == "tensor":
        return tensors[0]
    if kind == "dict":
        return dict(zip(layout["keys"], tensors))
    return list(tensors) if kind == "list" else tuple(tensors)
