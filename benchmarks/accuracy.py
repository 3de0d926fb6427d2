"""Accuracy vs compression: the digits example pipelined with every codec and bit width.

    python benchmarks/accuracy.py              # quick: 2 processes, 5 epochs
    python benchmarks/accuracy.py --full       # 3 processes, 20 epochs, 3 seeds

    python benchmarks/accuracy.py --only lloydmax bottleneck   # codecs whose label starts so

``examples/digits`` (``DigitsClassifier``: 64 -> 7 x 256 -> 10; scikit-learn's 1797 digits,
no download) over EPipeStrategy (client-server placement, chunks 4): ``none``, ``fp16``,
``sortquant``, ``quantize`` and ``lloydmax`` at 16 (12, 8, 6) 4 and 2 bits, ``topk`` (10%)
and ``powersgd`` (rank 4), each lossy one also with error feedback on the gradients
(``+ef``), 4- and 2-bit deltas of each sample's activation since the last epoch
(``+delta``, AQ-SGD; the first epoch uncompressed), and learned bottlenecks at ratios 0.1 and 0.25 (PCA start on 256 training
images; plain float32 codes, or 8-bit sort-quantized ones); activations and gradients both
compressed. Final test accuracy against the compression ratio measured on the wire
(headers included): the report's figure. Writes ``benchmarks/results/accuracy.{png,json}``:
the rows, the load average around the run and two tables (``"table"``: the plain codecs,
then error feedback, deltas and bottlenecks).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import axes, finish, fmt, load_average, markdown_table, run, write_json  # noqa: E402

BITS = [16, 12, 8, 6, 4, 2]
LLOYD_BITS = [8, 6, 4, 2]


def codecs() -> dict[str, dict]:
    out = {"none": {"compressor": "none"}, "fp16": {"compressor": "fp16"}}
    for name in ("sortquant", "quantize"):
        out.update({f"{name}-{b}": {"compressor": name, "bits": b} for b in BITS})
    out.update({f"lloydmax-{b}": {"compressor": "lloydmax", "bits": b} for b in LLOYD_BITS})
    out["topk-0.1"] = {"compressor": "topk", "compressor_kwargs": {"fraction": 0.1}}
    out["powersgd-4"] = {"compressor": "powersgd", "compressor_kwargs": {"rank": 4}}
    for label in ("sortquant-4", "quantize-4", "lloydmax-4", "lloydmax-2", "topk-0.1", "powersgd-4"):
        out[f"{label}+ef"] = {**out[label], "error_feedback": True}
    for label in ("lloydmax-4", "lloydmax-2", "quantize-2", "sortquant-2"):  # AQ-SGD: deltas since last epoch
        out[f"{label}+delta"] = {**out[label], "delta_compression": True}
    for ratio in (0.1, 0.25):
        out[f"bottleneck-{ratio}"] = {"compressor": "bottleneck", "compressor_kwargs": {"ratio": ratio}}
    out["bottleneck-0.1+sortquant-8"] = {"compressor": "bottleneck", "bits": 8,
                                         "compressor_kwargs": {"ratio": 0.1, "wire": "sortquant"}}
    return out


def measure(devices: int, epochs: int, seeds: list[int], only: list[str] | None = None) -> list[dict]:
    rows = []
    for label, codec in codecs().items():
        if only and label != "none" and not label.startswith(tuple(only)):
            continue
        results = [run(dict(kind="digits", devices=devices, chunks=4, epochs=epochs, seed=s, codec=codec, timeout=600))
                   for s in seeds]
        ok = [r for r in results if "test_acc" in r]
        row = {"codec": label, "runs": len(ok), "error": next((r["error"] for r in results if "error" in r), None)}
        if ok:
            accs = [r["test_acc"] for r in ok]
            row.update(test_acc=statistics.mean(accs), acc_min=min(accs), acc_max=max(accs),
                       ratio=statistics.mean(r["ratio"] for r in ok))
        print(f"  {label}: {row.get('test_acc', row['error'])}", flush=True)
        rows.append(row)
    return rows


def is_plain(label: str) -> bool:
    """A codec on its own: no error feedback, deltas or bottleneck."""
    return "+" not in label and not label.startswith("bottleneck")


def tables(rows: list[dict]) -> list[str]:
    """The plain codecs' table, then the others' (each row against ``none``)."""
    base = [r for r in rows if r["codec"] == "none"]
    plain = [r for r in rows if is_plain(r["codec"])]
    rest = [r for r in rows if not is_plain(r["codec"])]
    return [table(plain)] + ([table(rest, base)] if rest else [])


def table(rows: list[dict], base_rows: list[dict] | None = None) -> str:
    base = next((r.get("test_acc") for r in (base_rows or rows) if r["codec"] == "none"), None)
    body = [[r["codec"], fmt(r.get("ratio"), ".3f"),
             fmt(r.get("test_acc"), ".3f") if "test_acc" in r else f"failed: {r['error']}",
             f"{r['acc_min']:.3f}-{r['acc_max']:.3f}" if r.get("runs", 0) > 1 else "-",
             fmt(r["test_acc"] - base if "test_acc" in r and base is not None else None, "+.3f")] for r in rows]
    return markdown_table(["codec", "wire ratio", "test acc", "range over seeds", "vs none"], body)


def plot(rows: list[dict], name: str = "accuracy.png") -> Path:
    fig, ax = axes()
    families = {"sortquant": "o-", "quantize": "s--", "lloydmax": "d-."}
    for fam, style in families.items():
        pts = sorted((r["ratio"], r["test_acc"], r["codec"]) for r in rows
                     if r["codec"].startswith(fam) and "+" not in r["codec"] and "test_acc" in r)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=fam)
        for x, y, c in pts:
            ax.annotate(c.split("-")[1] + "b", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    markers = {"+ef": "s", "+delta": "D", "bottleneck": "*"}
    for r in rows:
        if "test_acc" in r and (not r["codec"].startswith(tuple(families)) or "+" in r["codec"]):
            marker = next((m for key, m in markers.items() if key in r["codec"]), "^")
            ax.plot(r["ratio"], r["test_acc"], marker, markersize=9 if marker == "*" else 6, label=r["codec"])
    ax.set_xscale("log")
    return finish(fig, ax, name, "compression ratio on the wire (bytes sent / uncompressed)",
                  "final test accuracy", "Digits, pipelined: accuracy vs compression")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--devices", type=int)
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--seeds", nargs="+", type=int)
    parser.add_argument("--only", nargs="+", help="run only the codecs whose label starts with one of these (and none)")
    parser.add_argument("--out", default="accuracy.json", help="file name under benchmarks/results")
    args = parser.parse_args()
    before = load_average()
    rows = measure(args.devices or (3 if args.full else 2), args.epochs or (20 if args.full else 5),
                   args.seeds or ([0, 1, 2] if args.full else [0]), args.only)
    written = tables(rows)
    write_json(args.out, {"load_before": before, "load_after": load_average(), "rows": rows, "table": written})
    print("\n\n".join(written))
    print("plot:", plot(rows, Path(args.out).with_suffix(".png").name))


if __name__ == "__main__":
    main()
