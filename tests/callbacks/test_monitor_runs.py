"""EPipeMonitor in real 3-process trainings, checked against the bytes known tensors must take.

``monitored_run.py`` trains 4 steps of 2 micro-batches of 16 rows (3 batches an epoch, so
the run crosses an epoch boundary) and logs every 2 steps to a CSVLogger. Each message on a
link is the transport header plus the codec packet of one [16, width] float32 tensor, or of
the whole [32, width] batch of raw inputs; the first frame of each message key is announced
by a size notice of a bare header, counted with the link's bytes like any other.
"""

from __future__ import annotations

import csv
import json
import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import yaml

from examples.common import wandb_offline
from lightning_epipe.callbacks.loggers import LINK_COLUMNS
from lightning_epipe.compressors import get_compressor
from lightning_epipe.strategy.comm.wire import HEADER_LEN
from tests.callbacks.monitored_run import BATCH, CHUNKS, STEPS
from tests.helpers import ROOT, run_ranks

SCRIPT = ROOT / "tests" / "callbacks" / "monitored_run.py"
ROWS = BATCH // CHUNKS
RUNS = {"client-server": [], "chain": ["--placement", "chain", "--validate", "--wandb"]}

# link -> (codec, columns of the tensor it carries); client-server: none | sortquant 8 | none
LINKS = {
    "client-server": {
        "activation/0->1": ("none", 256), "activation/1->2": ("sortquant", 128), "activation/2->0": ("none", 64),
        "gradient/1->0": ("none", 256), "gradient/2->1": ("sortquant", 128), "gradient/0->2": ("none", 64),
    },
    "chain": {
        "input/0->1": ("none", 32), "activation/1->2": ("sortquant", 256), "activation/2->0": ("sortquant", 128),
        "gradient/2->1": ("sortquant", 256), "gradient/0->2": ("sortquant", 128),
    },
}


def message_bytes(codec: str, columns: int, rows: int = ROWS) -> int:
    kwargs = {"bits": 8} if codec == "sortquant" else {}
    return HEADER_LEN * 8 + get_compressor(codec, **kwargs).encode(torch.randn(rows, columns)).nbytes


# the raw inputs' first message says their layout (JSON); it is sent again only if the layout changes
LAYOUT_BYTES = HEADER_LEN * 8 + len(json.dumps({"type": "tensor", "count": 1}).encode())
NOTICE = HEADER_LEN * 8  # the first frame of a message key: a notice of the bare header's size goes first


def step_traffic(label: str, codec: str, columns: int) -> tuple[int, int, int, int]:
    """(bytes, messages) one step puts on ``label``, and the (bytes, messages) its first step adds: raw inputs
    this small cross as the whole batch (one message a step, led once by their layout); every
    other link carries one message per micro-batch. The first step's frames are announced."""
    if label.startswith("input"):
        # step 1: the layout (key index 0) and the batch (index 1), each announced by a bare notice;
        # step 2: the batch alone takes index 0, announced by a notice of the layout's size
        return message_bytes(codec, columns, BATCH), 1, 2 * NOTICE + 2 * LAYOUT_BYTES, 1
    return message_bytes(codec, columns) * CHUNKS, CHUNKS, CHUNKS * NOTICE, 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both runs at once (most of a run is process start-up)."""
    outs = {name: tmp_path_factory.mktemp(name) for name in RUNS}
    with ThreadPoolExecutor(len(RUNS)) as pool:
        futures = [pool.submit(run_ranks, SCRIPT, "--out", outs[name], *args, timeout=180) for name, args in RUNS.items()]
        for future in futures:
            future.result()
    results = {}
    for name, out in outs.items():
        result = json.loads((out / "result.json").read_text())
        with open(out / "csv" / "version_0" / "metrics.csv") as f:
            rows = [{k: float(v) for k, v in row.items() if v} for row in csv.DictReader(f)]
        result["steps"] = [r for r in rows if any(k.startswith("epipe/") for k in r)]
        result["epochs"] = [r for r in rows if any(k.startswith("epipe_epoch/") for k in r)]
        result["out"] = out
        results[name] = result
    return results


@pytest.mark.parametrize("placement", list(RUNS))
def test_logged_bytes_are_header_plus_packet_per_message(runs, placement):
    run = runs[placement]
    validation = placement == "chain"  # one validation batch at the end of epoch 0: forward messages only
    # log every 2 steps: batches 1-2 (epoch 0), then batch 4 (the window restarts at the epoch end)
    step_batches = [2, 1]
    epoch_batches = [3, 1]
    assert [r["step"] for r in run["steps"]] == [1, 3] and [r["epoch"] for r in run["epochs"]] == [0, 1]
    for label, (codec, columns) in LINKS[placement].items():
        size, messages, once, once_messages = step_traffic(label, codec, columns)
        forward = not label.startswith("gradient")
        for row, batches, first in zip(run["steps"], step_batches, [True, False]):
            assert row[f"epipe/bytes/{label}"] == size * batches + first * once, label
        for row, batches, val, first in zip(run["epochs"], epoch_batches, [validation, False], [True, False]):
            assert row[f"epipe_epoch/bytes/{label}"] == size * (batches + (val and forward)) + first * once, label
        link = run["summary"]["links"][label]
        steps = STEPS + (validation and forward)
        assert link["messages"] == messages * steps + once_messages, label
        assert link["bytes_sent"] == link["bytes_received"] == size * steps + once, label  # both ends


@pytest.mark.parametrize("placement", list(RUNS))
def test_summary_agrees_with_the_clients_transport_counters(runs, placement):
    run = runs[placement]
    assert run["client_links"], "rank 0 counted nothing"
    for label, values in run["client_links"].items():
        messages, nbytes, raw, _seconds, peak = values
        link = run["summary"]["links"][label]
        assert (link["messages"], link["bytes_sent"], link["raw_bytes"]) == (messages, nbytes, raw), label
        if peak:  # rank 0 received on this link: its own peak
            assert link["bandwidth_peak"] == pytest.approx(peak), label


def test_ratio_is_slightly_above_one_without_compression_and_near_a_quarter_with_sortquant_8(runs):
    run = runs["client-server"]
    last = run["epochs"][-1]
    for cut, codec in enumerate(["none", "sortquant", "none"]):
        for kind in ("activation", "gradient"):
            ratio = last[f"epipe_epoch/ratio/{kind}/cut{cut}"]
            if codec == "none":
                assert 1.0 < ratio < 1.05, (kind, cut, ratio)
            else:
                assert 0.25 <= ratio <= 0.3, (kind, cut, ratio)
    links = run["summary"]["links"].values()
    overall = sum(link["bytes_sent"] for link in links) / sum(link["raw_bytes"] for link in links)
    assert run["summary"]["ratio"] == pytest.approx(overall)
    assert runs["chain"]["summary"]["links"]["input/0->1"]["codec"] == "raw"
    chain = runs["chain"]["summary"]
    assert 1.0 < chain["links"]["input/0->1"]["ratio"] < 1.2  # headers + layout on 32x32 floats
    assert 0.25 <= chain["ratio_activation"] <= 0.3 and 0.25 <= chain["ratio_gradient"] <= 0.3
    every_byte = sum(link["bytes_sent"] for link in chain["links"].values())
    assert chain["ratio"] == pytest.approx(every_byte / sum(link["raw_bytes"] for link in chain["links"].values()))
    assert chain["ratio"] > chain["ratio_activation"]  # the raw inputs are in it
    assert chain["ranks"]["0"]["ratio"] == pytest.approx(  # JSON keys
        sum(link["bytes_sent"] for link in chain["links"].values() if link["src"] == 0)
        / sum(link["raw_bytes"] for link in chain["links"].values() if link["src"] == 0)
    )


@pytest.mark.parametrize("placement", list(RUNS))
def test_throughput_bandwidth_and_bubble_are_measured(runs, placement):
    run = runs[placement]
    summary = run["summary"]
    assert summary["batches"] == STEPS and summary["samples"] == STEPS * BATCH
    assert summary["throughput_samples_per_s"] > 0 and summary["train_seconds"] <= summary["wall_seconds"]
    for row in run["steps"]:
        assert row["epipe/throughput_samples_per_s"] > 0 and row["epipe/throughput_batches_per_s"] > 0
    for label, link in summary["links"].items():
        assert link["bandwidth_avg"] > 0 and link["bandwidth_peak"] > 0, label  # peaks come from every receiver
        assert link["bandwidth_avg"] == pytest.approx(link["bytes_sent"] / summary["compute_seconds"])
        assert link["bandwidth_wall"] == pytest.approx(link["bytes_sent"] / summary["wall_seconds"])
    busiest = max(rank["compute_s"] for rank in summary["ranks"].values())
    assert summary["compute_seconds"] == pytest.approx(busiest)
    assert 0 < summary["compute_seconds"] < summary["wall_seconds"]
    for stage in summary["stages"].values():
        assert stage["compute_s"] > 0
    for rank in summary["ranks"].values():
        assert rank["wait_s"] > 0 and 0 < rank["bubble"] < 1
    assert set(run["progress_bar"]) >= {"samples/s", "wire/raw"}
    assert math.isclose(run["progress_bar"]["wire/raw"], run["steps"][-1]["epipe/ratio"], rel_tol=1e-6)
    assert "samples/s" in run["table"] and "activation/" in run["table"]


def test_tensorboard_logger_gets_the_metrics_too(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (runs["chain"]["out"] / "tb").rglob("events.out.tfevents.*")
    board = EventAccumulator(str(events))
    board.Reload()
    logged = [e.value for e in board.Scalars("epipe/ratio")]
    assert logged == pytest.approx([row["epipe/ratio"] for row in runs["chain"]["steps"]])
    assert "epipe_epoch/bandwidth_avg/input/0->1" in board.Tags()["scalars"]


def test_every_logger_gets_the_pipeline_plan(runs):
    hparams = yaml.safe_load((runs["chain"]["out"] / "csv" / "version_0" / "hparams.yaml").read_text())
    assert hparams["epipe"] == {
        "placement": "chain", "ranks": 3, "balance": [2, 2, 3], "stage_ranks": [1, 2, 0],
        "codecs": runs["chain"]["summary"]["compressors"], "chunks": CHUNKS, "schedule": "gpipe", "replicas": 1,
    }
    (run_dir,) = (runs["chain"]["out"] / "wandb").glob("offline-run-*")
    assert wandb_offline.config(run_dir)["epipe"] == hparams["epipe"]


def test_wandb_gets_the_axes_the_metrics_and_the_link_table(runs):
    (run_dir,) = (runs["chain"]["out"] / "wandb").glob("offline-run-*")
    axes = wandb_offline.metric_axes(run_dir)
    assert axes["epipe/*"] == "trainer/global_step" and axes["epipe_epoch/*"] == "epoch"
    rows = wandb_offline.history(run_dir)
    steps = [row for row in rows if "epipe/ratio" in row]
    assert [row["trainer/global_step"] for row in steps] == [row["step"] for row in runs["chain"]["steps"]]
    assert [row["epipe/ratio"] for row in steps] == pytest.approx([row["epipe/ratio"] for row in runs["chain"]["steps"]])
    (table,) = [row["epipe/links/path"] for row in rows if "epipe/links/path" in row]  # nested keys joined by /
    content = json.loads((run_dir / "files" / table).read_text())
    assert content["columns"] == list(LINK_COLUMNS)
    summary = runs["chain"]["summary"]
    assert [row[0] for row in content["data"]] == list(summary["links"])
    for row in content["data"]:
        link = summary["links"][row[0]]
        assert dict(zip(LINK_COLUMNS[3:], row[3:])) == pytest.approx({c: link[c] for c in LINK_COLUMNS[3:]})
