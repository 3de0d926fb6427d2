"""Compressor benchmark: ratio, error and speed of every codec on realistic tensors.

    python benchmarks/compressors.py            # quick: ReLU6 activation [8, 32, 112, 112]
    python benchmarks/compressors.py --full     # the report's [32, 32, 112, 112]

Tensors: a ReLU6 activation (MobileNetV2-like, conv output ~ N(0, 2) through ReLU6: about
half zeros and a few at 6), a GELU activation [8, 128, 768] (RoBERTa-like), and a
gradient-like tensor of each shape (normal times a log-normal scale, heavy-tailed like real
gradients, ~1e-3). Prints a markdown table and writes ``benchmarks/results/compressors.png``.
Times are the best of ``--repeats`` rounds over all codecs, with ``--threads`` torch threads
(not a test: numbers vary with the load of the machine).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from lightning_epipe.compressors import get_compressor

CODECS = [
    ("none", {}),
    ("fp16", {}),
    ("bf16", {}),
    ("quantize", {"bits": 4}),
    ("quantize", {"bits": 8}),
    ("quantize", {"bits": 12}),
    ("sortquant", {"bits": 4}),
    ("sortquant", {"bits": 8}),
    ("sortquant", {"bits": 8, "split": 4}),
    ("sortquant", {"bits": 8, "boundaries": "exact"}),
    ("sortquant", {"bits": 12}),
    ("lloydmax", {"bits": 4}),
    ("lloydmax", {"bits": 8}),
    ("topk", {"fraction": 0.1}),
    ("topk", {"fraction": 0.1, "bits": 8}),
    ("powersgd", {"rank": 4}),
]


def tensors(full: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    relu_shape = (32 if full else 8, 32, 112, 112)
    gelu_shape = (8, 128, 768)

    def gradient(shape):
        scale = 1e-3 * torch.exp(0.5 * torch.randn(shape, generator=g))
        return torch.randn(shape, generator=g) * scale

    return {
        f"relu6 {list(relu_shape)}":
            torch.nn.functional.relu6(2 * torch.randn(relu_shape, generator=g)),
        f"relu6 grad {list(relu_shape)}": gradient(relu_shape),
        f"gelu {list(gelu_shape)}": torch.nn.functional.gelu(torch.randn(gelu_shape, generator=g)),
        f"gelu grad {list(gelu_shape)}": gradient(gelu_shape),
    }


def label(name: str, kwargs: dict) -> str:
    return name + "".join(f" {k}={v}" for k, v in kwargs.items())


def measure(x: torch.Tensor, repeats: int) -> list[dict]:
    """One row per codec. Timing runs in rounds over all codecs, best of ``repeats``, so a
    burst of load from other processes hits every codec alike instead of one."""
    codecs = [get_compressor(name, **kwargs) for name, kwargs in CODECS]
    packets = [codec.encode(x) for codec in codecs]
    encode = [[] for _ in codecs]
    decode = [[] for _ in codecs]
    for _ in range(repeats):
        for codec, packet, enc, dec in zip(codecs, packets, encode, decode):
            start = time.perf_counter()
            codec.encode(x)
            middle = time.perf_counter()
            codec.decode(packet)
            enc.append(middle - start)
            dec.append(time.perf_counter() - middle)
    rows = []
    for (name, kwargs), codec, packet, enc, dec in zip(CODECS, codecs, packets, encode, decode):
        y = codec.decode(packet)
        rows.append({
            "codec": label(name, kwargs),
            "bits": kwargs.get("bits") if name in ("quantize", "sortquant", "lloydmax") else None,
            "ratio": packet.nbytes / (x.numel() * x.element_size()),
            "error": float((y.double() - x.double()).norm() / x.double().norm()),
            "encode": 1e3 * min(enc),
            "decode": 1e3 * min(dec),
        })
    uniform = {r["bits"]: r["encode"] for r in rows if r["codec"].startswith("quantize")}
    for r in rows:
        r["vs_quantize"] = r["encode"] / uniform[r["bits"]] if r["bits"] in uniform else None
    return rows


def table(results: dict[str, list[dict]]) -> str:
    lines = ["| tensor | codec | ratio | rel. error | encode ms | decode ms | encode / quantize |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for tensor, rows in results.items():
        for r in rows:
            vs = "" if r["vs_quantize"] is None else f"{r['vs_quantize']:.1f}x"
            lines.append(f"| {tensor} | {r['codec']} | {r['ratio']:.4f} | {r['error']:.2e} | "
                         f"{r['encode']:.1f} | {r['decode']:.1f} | {vs} |")
    return "\n".join(lines)


def plot(results: dict[str, list[dict]], path: Path) -> None:
    """Per codec (rows): encode time and relative error, one bar per tensor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = next(iter(results.values()))
    names = [f"{r['codec']}  (ratio {r['ratio']:.3f})" for r in first]
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 7), sharey=True)
    height = 0.8 / len(results)
    for i, (tensor, rows) in enumerate(results.items()):
        rows_at = [j + i * height for j in range(len(rows))]
        left.barh(rows_at, [r["encode"] for r in rows], height=height, label=tensor)
        right.barh(rows_at, [r["error"] for r in rows], height=height, label=tensor)
    left.set_yticks([j + 0.4 - height / 2 for j in range(len(names))], names, fontsize=7)
    left.invert_yaxis()
    left.set_xscale("log")
    left.set_xlabel("encode time, ms (log)")
    right.set_xscale("log")
    right.set_xlabel("||x - y|| / ||x||, log (none: 0, no bar)")
    right.legend(fontsize=7)
    fig.suptitle(f"lightning_epipe compressors, {torch.get_num_threads()} CPU threads "
                 "(ratio: compressed / raw bytes of the first tensor)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true",
                        help="ReLU6 activation at [32, 32, 112, 112]")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per codec (best taken)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch CPU threads (default: all)")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "compressors.png")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {name: measure(x, args.repeats) for name, x in tensors(args.full).items()}
    print(table(results))
    plot(results, args.out)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
