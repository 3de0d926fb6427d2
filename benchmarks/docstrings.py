"""Codecs on a real pretrained transformer: examples/docstrings (all-MiniLM-L6-v2, no download).

    python benchmarks/docstrings.py --errors-only          # relative error per layer, seconds
    python benchmarks/docstrings.py                        # + a first look at training, 1 seed

1. Errors: the pretrained model (no fine-tuning) on 64 validation docstrings of 64 tokens;
   the hidden states after the embeddings and after each of the 6 layers (what a cut
   carries), their kurtosis and largest |x| in standard deviations, and the relative L2
   error ``|decode(encode(x)) - x| / |x|`` and wire ratio (headers included) of each codec.
2. Training (unless ``--errors-only``): the example fine-tuned over 2 processes
   (client-server, balance [2, 4, 2], chunks 4), activations and gradients compressed,
   once per seed of ``--seeds`` (the seed drives the head's initialization, dropout and the
   shuffling), few epochs, a reduced corpus (``--per-class``, ``--max-length``). Final
   test accuracy and MCC per run; per codec the median over the seeds, the spread
   (min-max) and the median's difference to ``none``'s; the wire ratio.

Writes ``benchmarks/results/docstrings.json`` and prints the tables with the load average.
A run started by the script itself with ``--worker JSON`` is one training (rank 0 writes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, ROOT, fmt, free_port, markdown_table, write_json  # noqa: E402

#: Training runs: label -> ``EPipeStrategy`` keyword arguments.
CODECS = {
    "none": {"compressor": "none"},
    "fp16": {"compressor": "fp16"},
    "sortquant-8": {"compressor": "sortquant", "bits": 8},
    "sortquant-4": {"compressor": "sortquant", "bits": 4},
    "sortquant-4-1:1": {"compressor": "sortquant", "bits": 4, "compressor_kwargs": {"split": 2}},
    "quantize-8": {"compressor": "quantize", "bits": 8},
    "quantize-4": {"compressor": "quantize", "bits": 4},
    "lloydmax-4": {"compressor": "lloydmax", "bits": 4},
    "lloydmax-3": {"compressor": "lloydmax", "bits": 3},
    "lloydmax-2": {"compressor": "lloydmax", "bits": 2},
    "hadamard-4": {"compressor": "hadamard", "bits": 4},
    "hadamard-3": {"compressor": "hadamard", "bits": 3},
    "topk-10%": {"compressor": "topk", "compressor_kwargs": {"fraction": 0.1}},
    "powersgd-r8": {"compressor": "powersgd", "compressor_kwargs": {"rank": 8}},
    "sortquant-4+EF": {"compressor": "sortquant", "bits": 4, "error_feedback": True},
    "delta+sortquant-4": {"compressor": "sortquant", "bits": 4, "delta_compression": True},
    "bottleneck-0.1+sortquant-8": {"compressor": "bottleneck",
                                   "compressor_kwargs": {"ratio": 0.1, "wire": "sortquant", "bits": 8}},
    "bottleneck-0.25+hadamard-4": {"compressor": "bottleneck",
                                   "compressor_kwargs": {"ratio": 0.25, "wire": "hadamard", "bits": 4}},
    "bottleneck-0.375+lloydmax-3": {"compressor": "bottleneck",
                                    "compressor_kwargs": {"ratio": 0.375, "wire": "lloydmax", "bits": 3}},
    "bottleneck-0.375+lloydmax-3,lr=1e-3": {"compressor": "bottleneck",
                                            "compressor_kwargs": {"ratio": 0.375, "wire": "lloydmax", "bits": 3,
                                                                  "lr": 1e-3}},
}
#: Codecs of the error table (plain codecs only: a bottleneck must be trained).
ERROR_CODECS = ("none", "sortquant-8", "sortquant-4", "sortquant-4-1:1", "quantize-8", "quantize-4",
                "lloydmax-4", "lloydmax-3", "hadamard-4", "hadamard-3")


def errors(samples: int = 64, max_length: int = 64) -> dict:
    """Per layer: kurtosis, max |z|, and {codec: (relative error, ratio)} on pretrained states."""
    import torch
    import transformers
    from transformers import BertModel

    from examples.docstrings.data import DocstringsDataModule
    from examples.docstrings.pretrained import model_dir
    from lightning_epipe.compressors import get_compressor

    transformers.logging.set_verbosity_error()
    data = DocstringsDataModule(max_length=max_length, batch_size=samples)
    data.setup("fit")
    (ids, mask), _ = next(iter(data.val_dataloader()))
    bert = BertModel.from_pretrained(str(model_dir()), add_pooling_layer=False).eval()
    with torch.no_grad():
        states = bert(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    out = {}
    for layer, x in enumerate(states):
        z = (x - x.mean()) / x.std()
        row = {"kurtosis": float(z.pow(4).mean()), "max_abs_z": float(z.abs().max()), "codecs": {}}
        for label in ERROR_CODECS:
            spec = CODECS[label]
            kwargs = {**spec.get("compressor_kwargs", {}), **({"bits": spec["bits"]} if "bits" in spec else {})}
            codec = get_compressor(spec["compressor"], **kwargs)
            y = codec.decode(codec.encode(x))
            row["codecs"][label] = {"rel_err": float((y - x).norm() / x.norm()), "ratio": codec.ratio(x)}
        out[str(layer)] = row
    return out


def worker(cfg: dict) -> None:
    """One pipelined training (this process is rank 0 or, re-run by Lightning, rank 1)."""
    import lightning as L
    import torch
    import transformers

    from examples.docstrings.data import DocstringsDataModule
    from examples.docstrings.model import MiniLMClassifier
    from lightning_epipe import EPipeStrategy
    from lightning_epipe.callbacks import EPipeMonitor

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    L.seed_everything(cfg["seed"], verbose=False)
    data = DocstringsDataModule(per_class=cfg["per_class"], max_length=cfg["max_length"], batch_size=cfg["batch"])
    model = MiniLMClassifier(num_classes=data.num_classes, lr=cfg["lr"])
    if cfg["codec"]["compressor"] == "bottleneck":  # sized and PCA-started on real training docstrings
        data.setup("fit")
        model.example_input_array = next(iter(data.train_dataloader()))[0]
    strategy = EPipeStrategy(chunks=4, placement="client-server", balance=[2, 4, 2],
                             timeout=timedelta(seconds=600), **cfg["codec"])
    monitor = EPipeMonitor(prog_bar=False)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=cfg["epochs"],
                        callbacks=[monitor], logger=False, enable_checkpointing=False,
                        enable_model_summary=False, enable_progress_bar=False, num_sanity_val_steps=0,
                        log_every_n_steps=10)
    start = time.perf_counter()
    trainer.fit(model, data)
    fit_s = time.perf_counter() - start
    summary = monitor.summary() if trainer.is_global_zero else None
    (result,) = trainer.test(model, data, verbose=False)
    if trainer.is_global_zero:
        report = {"test_acc": result["test_acc"], "test_mcc": result["test_mcc"], "ratio": summary["ratio"],
                  "fit_s": fit_s, "train_size": len(data.train_set), "test_size": len(data.test_set)}
        Path(cfg["out"]).write_text(json.dumps(report))


def train(label: str, cfg: dict, timeout: float) -> dict:
    """Run ``worker`` for ``CODECS[label]`` in fresh processes; its report or ``{"error": ...}``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cfg = {**cfg, "codec": CODECS[label], "out": str(out)}
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
               "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(cfg)]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            log = proc.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            return {"error": f"no result after {timeout:.0f} s", "log": proc.communicate()[0][-1500:]}
        if proc.returncode == 0 and out.exists():
            return json.loads(out.read_text())
        return {"error": f"exit code {proc.returncode}", "log": log[-1500:]}


def error_table(errs: dict) -> str:
    codecs = list(next(iter(errs.values()))["codecs"])
    header = ["after", "kurtosis", "max |z|", *codecs]
    rows = [["embeddings" if layer == "0" else f"layer {layer}", fmt(r["kurtosis"], ".1f"), fmt(r["max_abs_z"], ".1f"),
             *(f"{r['codecs'][c]['rel_err']:.3f} ({r['codecs'][c]['ratio']:.3f})" for c in codecs)]
            for layer, r in errs.items()]
    return markdown_table(header, rows)


def seed_summary(runs: dict) -> dict:
    """Per codec, over its seeds: median and (min, max) of accuracy and MCC, their medians'
    difference to ``none``'s, the median wire ratio, and the seeds that failed."""
    out = {}
    for label, by_seed in runs.items():
        done = [r for r in by_seed.values() if "error" not in r]
        row = {"seeds": len(done), "failed": sorted(s for s, r in by_seed.items() if "error" in r)}
        for key in ("test_acc", "test_mcc", "ratio"):
            values = [r[key] for r in done]
            row[key] = statistics.median(values) if values else None
            row[key + "_spread"] = (min(values), max(values)) if values else None
        out[label] = row
    base = out.get("none", {})
    for row in out.values():
        for key in ("test_acc", "test_mcc"):
            both = row[key] is not None and base.get(key) is not None
            row[key + "_vs_none"] = row[key] - base[key] if both else None
    return out


def train_table(summary: dict) -> str:
    def spread(pair):
        return "-" if pair is None else f"{pair[0]:.3f}-{pair[1]:.3f}"

    rows = [[label, r["seeds"], fmt(r["test_acc"], ".3f"), spread(r["test_acc_spread"]), fmt(r["test_acc_vs_none"], "+.3f"),
             fmt(r["test_mcc"], ".3f"), spread(r["test_mcc_spread"]), fmt(r["test_mcc_vs_none"], "+.3f"),
             fmt(r["ratio"], ".3f"), ", ".join(map(str, r["failed"]))] for label, r in summary.items()]
    return markdown_table(["codec", "seeds", "test acc (median)", "acc spread", "acc vs none", "test MCC (median)",
                           "MCC spread", "MCC vs none", "wire ratio", "failed seeds"], rows)


def previous_runs(name: str, train_config: dict) -> dict:
    """The runs already in ``benchmarks/results/<name>``; they must share ``train_config``."""
    path = RESULTS / name
    if not path.exists():
        return {}
    previous = json.loads(path.read_text())
    if previous.get("train_config") != train_config:
        raise SystemExit(f"--append: {path} was trained with {previous.get('train_config')}, this run with "
                         f"{train_config}; give the same options or another --out")
    return previous.get("runs", {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--errors-only", action="store_true")
    parser.add_argument("--only", nargs="*", help="codec labels to train (default: all)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--per-class", type=int, default=300)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--out", default="docstrings.json")
    parser.add_argument("--append", action="store_true",
                        help="keep the other codecs' runs already in --out (same training configuration)")
    args = parser.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))

    result = {"errors": errors(), "load_before": os.getloadavg()}
    print("Relative L2 error (wire ratio) on the pretrained hidden states, 64 docstrings x 64 tokens:")
    print(error_table(result["errors"]))
    if not args.errors_only:
        cfg = dict(epochs=args.epochs, per_class=args.per_class, max_length=args.max_length, batch=32, lr=args.lr)
        result["train_config"] = {**cfg, "seeds": args.seeds}
        labels = args.only or list(CODECS)
        result["runs"] = previous_runs(args.out, result["train_config"]) if args.append else {}
        runs = result["runs"]
        runs.update({label: {} for label in labels})
        for seed in args.seeds:  # seeds outermost: every codec gets the same machine conditions
            for label in labels:
                runs[label][str(seed)] = train(label, {**cfg, "seed": seed}, args.timeout)
                print(label, seed, {k: v for k, v in runs[label][str(seed)].items() if k != "log"}, flush=True)
                result["summary"] = seed_summary(runs)
                write_json(args.out, result)
        result["table"] = train_table(result["summary"])
        print(f"\nseeds {args.seeds}, {args.epochs} epochs, {args.per_class} docstrings a class, "
              f"{args.max_length} tokens, 2 processes:")
        print(result["table"])
    result["load_after"] = os.getloadavg()
    print(f"load average before {result['load_before']}, after {result['load_after']}")
    print("wrote", write_json(args.out, result))


if __name__ == "__main__":
    main()
