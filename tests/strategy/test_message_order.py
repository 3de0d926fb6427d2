"""Every layout's message order, in one process: the runtime's ranks as threads on the
in-memory fabric, under NCCL's rule (one stream per communicator, run in posting order, a
send done only when the peer's stream reaches the matching receive: zero buffering) and
under gloo's. A stalled order times out; a message out of order is a WireError; and the
weights after two SGD steps must equal one process's (so every message reached its
right receiver)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_epipe.strategy.comm.transport import Transport
from lightning_epipe.strategy.comm.wire import Kind
from lightning_epipe.strategy.engine import split_backward
from lightning_epipe.strategy.engine.runtime import PipelineRuntime

from tests.strategy.threaded import make_layers, reference, run_threaded

LAYOUTS = [(p, k) for p in ("client-server", "chain") for k in (2, 3, 4)]


def _check_weights(trained, plan, batches, replicas, make=make_layers):
    expected = reference(batches, make)
    size = plan.num_ranks
    for rank, layers in trained.items():
        for i in plan.layers_of(rank % size):
            for (name, got), want in zip(layers[i].named_parameters(), expected[i].parameters()):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"rank {rank} layer {i} {name}: {m}")
    assert len(trained) == size * replicas


@pytest.mark.parametrize("split", [False, True], ids=["whole-backward", "split-backward"])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("placement", "size"), LAYOUTS)
@pytest.mark.parametrize("replicas", [1, 2])
def test_every_layout_drains_under_nccl_rules(placement, size, schedule, replicas, split):
    for chunks in range(1, 9):
        trained, _, plan, batches = run_threaded(placement, size, schedule, chunks, replicas=replicas, rule="nccl",
                                                 split_backward=split)
        _check_weights(trained, plan, batches, replicas)


@pytest.mark.parametrize("split", [False, True], ids=["whole-backward", "split-backward"])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("placement", "size"), LAYOUTS)
def test_every_layout_drains_under_gloo_rules(placement, size, schedule, split):
    for chunks in (1, 3, 8):
        trained, _, plan, batches = run_threaded(placement, size, schedule, chunks, rule="gloo", split_backward=split)
        _check_weights(trained, plan, batches, 1)


@pytest.mark.parametrize("rule", ["nccl", "gloo"])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("placement", "size"), LAYOUTS)
def test_servers_start_the_next_step_ahead(placement, size, schedule, rule):
    """A server whose optimizer step is done finds the client's next BATCH_START and FORWARD
    arrived and runs that step's forward at once (under 1F1B its tasks up to its first backward,
    the rest where the step's commands are served): every order still drains, and the weights
    equal one process's."""
    for chunks in (1, 4):
        trained, _, plan, batches = run_threaded(placement, size, schedule, chunks, steps=3, rule=rule, ahead=True)
        _check_weights(trained, plan, batches, 1)


@pytest.mark.parametrize("split", [False, True], ids=["whole-backward", "split-backward"])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("placement", "size"), LAYOUTS)
def test_every_rank_closes_its_step(placement, size, schedule, split):
    """Each step ends with no autograd state and no send left open on any rank: a micro-batch's
    saved graph or a weight pass kept past its step keeps its activations and gradients alive
    (a leak of every step's), and a send its frame."""
    _, fabric, _, _ = run_threaded(placement, size, schedule, 4, steps=3, rule="gloo", split_backward=split)
    assert fabric.open_ends == {rank: [(0, 0)] * 3 for rank in range(size)}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("rule", ["nccl", "gloo"])
def test_a_small_last_batch_resizes_its_frames(rule, schedule):
    """Rows not divisible by chunks, and a later step with other shapes: frames announce their new
    size (under gloo's rule while the phase's later receives are already posted)."""
    trained, fabric, plan, batches = run_threaded("client-server", 2, schedule, 5, rows=13, steps=3, rule=rule)
    _check_weights(trained, plan, batches, 1)
    sends = [size for rank, op, _peer, _group, size in fabric.log if op == "send" and rank == 0]
    assert len(set(sends)) > 2  # headers, notices and full frames of several sizes


@pytest.mark.parametrize(("placement", "receiver", "stream"), [
    ("chain", 0, "activation 1->0"),  # the client posts before it sends the inputs
    ("client-server", 0, "gradient 1->0"),  # ... and before its last stage's backward
])
def test_under_gloo_a_phase_posts_its_receives_at_once(placement, receiver, stream):
    """From the second step on, a rank posts a phase's receives (one tensor per micro-batch)
    before the first of its messages can have been sent."""
    _, fabric, _, _ = run_threaded(placement, 2, "gpipe", 4, steps=2, rule="gloo")
    ops = [(rank, op) for rank, op, _peer, group, _n in fabric.log if str(group).endswith(stream)]
    assert len(ops) == 16 and ops[8:12] == [(receiver, "recv")] * 4, ops  # each step: 4 receives, 4 sends


def test_one_stream_per_pair_would_stall():
    """The check has teeth: with every message between two ranks on one NCCL stream (one
    communicator per pair, NCCL's default for p2p), the 2-process pipeline stalls: rank 0 sends
    micro-batch 2's activation while rank 1 sends micro-batch 0's output back."""
    with pytest.raises(RuntimeError, match="Timed out|Connection reset"):
        run_threaded("client-server", 2, "gpipe", 4, rule="nccl", shared_streams=True, timeout=1.0)


@pytest.mark.parametrize(("placement", "size"), [("client-server", 2), ("chain", 3)])
def test_under_gloo_1f1b_posts_each_gradient_receive_once_its_forward_ran(monkeypatch, placement, size):
    """Under 1F1B a micro-batch's gradient receive is posted right after its forward, behind the
    earlier ones (gloo), not when the rank reaches the gradient before it: on the first stage's
    rank, micro-batch i's gradient receive is posted before it waits for i - 1's."""
    events: list[tuple[int, str, int]] = []
    post, recv = Transport._post_recv, Transport.recv

    def spy_post(self, name, group, device, peer, key, tag=0):
        if key[0] == Kind.GRADIENT:
            events.append((self.rank, "post", key[1]))
        return post(self, name, group, device, peer, key, tag)

    def spy_recv(self, peer, what, idle=False, **expect):
        if expect["kind"] == Kind.GRADIENT:
            events.append((self.rank, "wait", expect["microbatch"]))
        return recv(self, peer, what, idle, **expect)

    monkeypatch.setattr(Transport, "_post_recv", spy_post)
    monkeypatch.setattr(Transport, "recv", spy_recv)
    chunks = 4
    trained, _, plan, batches = run_threaded(placement, size, "1f1b", chunks, steps=1, rule="gloo")
    _check_weights(trained, plan, batches, 1)
    mine = [(op, mb) for rank, op, mb in events if rank == plan.stage_ranks[0]]
    for i in range(1, chunks):
        assert mine.index(("post", i)) < mine.index(("wait", i - 1)), mine


class _Fork(nn.Module):
    """[b, 32] -> ([b, 32], [b, 32]): two tensors that need gradients cross the cut after it."""

    def forward(self, x):
        return x, torch.tanh(x)


class _Join(nn.Module):
    def forward(self, pair):
        a, b = pair
        return a * b


def _forked_layers() -> nn.Sequential:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), _Fork(), _Join(), nn.Linear(32, 4))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("rule", ["nccl", "gloo"])
@pytest.mark.parametrize(("placement", "balance"), [("chain", [3, 2]), ("client-server", [3, 1, 1])])
def test_a_cut_of_two_tensors_drains_and_equals_one_process(placement, balance, rule, schedule):
    """Two gradients a micro-batch come back across the cut after ``_Fork`` (under 1F1B on gloo
    both are posted as soon as the micro-batch's forward has run), also with a small last batch."""
    for chunks, rows in ((1, 16), (3, 16), (4, 13)):
        trained, _, plan, batches = run_threaded(placement, 2, schedule, chunks, rule=rule, rows=rows,
                                                 make=_forked_layers, balance=balance)
        _check_weights(trained, plan, batches, 1, _forked_layers)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("placement", "size"), [("chain", 2), ("client-server", 3)])
def test_input_gradients_leave_before_the_weights_gradients(placement, size, schedule, monkeypatch):
    """Every stage that sends gradients upstream sends them before it computes its weights':
    under GPipe all of the step's, then one weight pass for the stage; under 1F1B each
    micro-batch's, then its weight pass. The weights still equal one process's."""
    events = []
    send_grads, run_passes = PipelineRuntime._send_grads, PipelineRuntime._run_weight_passes

    def sent(self, peer, cut, mb, *args):
        events.append((self.rank, cut + 1, "send", mb))
        return send_grads(self, peer, cut, mb, *args)

    def weights(self, s):
        if self._weight_passes.get(s):
            events.append((self.rank, s, "weights", len(self._weight_passes[s])))
        return run_passes(self, s)

    monkeypatch.setattr(PipelineRuntime, "_send_grads", sent)
    monkeypatch.setattr(PipelineRuntime, "_run_weight_passes", weights)
    chunks, steps = 4, 2
    trained, _, plan, batches = run_threaded(placement, size, schedule, chunks, steps=steps, rule="gloo",
                                             split_backward=True)
    _check_weights(trained, plan, batches, 1)
    for s in range(1, plan.num_stages):
        order = [(kind, n) for rank, stage, kind, n in events if stage == s]
        if schedule == "gpipe":
            step = [("send", mb) for mb in reversed(range(chunks))] + [("weights", chunks)]
        else:
            step = [e for mb in range(chunks) for e in (("send", mb), ("weights", 1))]
        assert order == step * steps, f"stage {s}: {order}"


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("placement", "size"), [("chain", 2), ("client-server", 3)])
def test_split_steps_with_recomputed_micro_batches(placement, size, schedule):
    """With recomputation of all micro-batches but the last, a split step backpropagates the
    recomputed ones whole and the last one in two passes, in the schedule's order."""
    trained, _, plan, batches = run_threaded(placement, size, schedule, 4, rule="gloo", split_backward=True,
                                             checkpoint="except_last")
    _check_weights(trained, plan, batches, 1)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_auto_splits_under_gpipe_and_runs_whole_backwards_under_1f1b(schedule, monkeypatch):
    """``split_backward="auto"`` with every stage over the FLOPs threshold: GPipe steps leave
    weight passes, 1F1B steps none (whole backwards); the weights equal one process's."""
    monkeypatch.setattr(split_backward, "SPLIT_MIN_FLOPS", 0)
    passes = []
    run_passes = PipelineRuntime._run_weight_passes

    def weights(self, s):
        passes.extend(self._weight_passes.get(s, []))
        return run_passes(self, s)

    monkeypatch.setattr(PipelineRuntime, "_run_weight_passes", weights)
    chunks, steps = 4, 2
    trained, _, plan, batches = run_threaded("chain", 2, schedule, chunks, steps=steps, rule="gloo",
                                             split_backward="auto")
    _check_weights(trained, plan, batches, 1)
    assert len(passes) == (chunks * steps if schedule == "gpipe" else 0)  # the last stage's, one per micro-batch
