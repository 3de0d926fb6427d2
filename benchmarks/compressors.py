"""Compressor benchmark: ratio, error and speed of every codec on realistic tensors.

    python benchmarks/compressors.py            # quick: ReLU6 activation [8, 32, 112, 112]
    python benchmarks/compressors.py --full     # the report's [32, 32, 112, 112]
    python benchmarks/compressors.py --overhead --baseline REV   # per-call cost by size

``--overhead``: encode + decode microseconds per call (CPU time of the one torch thread,
so other load on the machine does not count; with ``--device cuda`` wall time, the calls of a
round queued back to back and synchronized once at the end) on ReLU activations [n / 256, 256]
from 1 KiB to 64 MiB, for every codec of ``OVERHEAD_CODECS``, and encode and decode apart
up to 16 KiB; with ``--baseline REV``
the codecs of git revision REV (its ``lightning_epipe/compressors``, loaded under another
name) are timed in the same rounds, call for call, and the table shows before, after
and after / before. Writes ``benchmarks/results/compressors_overhead.json`` (``--overhead-out``) with the load
average at start and end. ``--overhead --cold``: the same calls, but each one after a stage's
worth of other work (a [64, 1024] x [1024, 1024] matmul and a pass over 16 MiB, not timed),
as a pipeline calls its codecs between a micro-batch's forward and backward: caches,
branch predictors and the interpreter's state start cold; tensors up to 128 KiB, 10 calls a
round; the tables' "before" is then the same codec's calls back to back, in the same round.

Tensors: a ReLU6 activation (MobileNetV2-like, conv output ~ N(0, 2) through ReLU6: about
half zeros and a few at 6), a GELU activation [8, 128, 768] (RoBERTa-like), and a
gradient-like tensor of each shape (normal times a log-normal scale, heavy-tailed like real
gradients, ~1e-3). Prints a markdown table and writes ``benchmarks/results/compressors.png``
and ``compressors.json`` (rows, table, load average before and after).
Times are the best of ``--repeats`` rounds over all codecs, with ``--threads`` torch threads
(not a test: numbers vary with the load of the machine). ``--device cuda``: the same tensors
and codecs on the GPU, each call timed to its completion (synchronized), written to
``compressors_cuda.png`` / ``.json`` beside the CPU's.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
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
    ("hadamard", {"bits": 4}),
    ("topk", {"fraction": 0.1}),
    ("topk", {"fraction": 0.1, "bits": 8}),
    ("powersgd", {"rank": 4}),
]


OVERHEAD_CODECS = [
    ("none", {}),
    ("fp16", {}),
    ("quantize", {"bits": 8}),
    ("quantize", {"bits": 4}),
    ("sortquant", {"bits": 8}),
    ("sortquant", {"bits": 8, "boundaries": "exact"}),
    ("lloydmax", {"bits": 4}),
    ("lloydmax", {"bits": 8}),
    ("hadamard", {"bits": 4}),
    ("topk", {"fraction": 0.1}),
    ("topk", {"fraction": 0.1, "bits": 8}),
    ("powersgd", {"rank": 4}),
]
#: Tensor sizes of the overhead table, in bytes of float32.
OVERHEAD_SIZES = [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 17, 1 << 18, 1 << 20, 1 << 22,
                  1 << 24, 1 << 26]


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


def synchronizer(x: torch.Tensor):
    """A call that waits for ``x``'s device to finish its queued work (nothing on the CPU)."""
    return (lambda: torch.cuda.synchronize(x.device)) if x.is_cuda else (lambda: None)


def label(name: str, kwargs: dict) -> str:
    return name + "".join(f" {k}={v}" for k, v in kwargs.items())


def measure(x: torch.Tensor, repeats: int) -> list[dict]:
    """One row per codec. Timing runs in rounds over all codecs, best of ``repeats``, so a
    burst of load from other processes hits every codec alike instead of one."""
    codecs = [get_compressor(name, **kwargs) for name, kwargs in CODECS]
    packets = [codec.encode(x) for codec in codecs]
    encode = [[] for _ in codecs]
    decode = [[] for _ in codecs]
    sync = synchronizer(x)
    for _ in range(repeats):
        for codec, packet, enc, dec in zip(codecs, packets, encode, decode):
            sync()
            start = time.perf_counter()
            codec.encode(x)
            sync()
            middle = time.perf_counter()
            codec.decode(packet)
            sync()
            enc.append(middle - start)
            dec.append(time.perf_counter() - middle)
    rows = []
    for (name, kwargs), codec, packet, enc, dec in zip(CODECS, codecs, packets, encode, decode):
        y = codec.decode(packet)
        rows.append({
            "codec": label(name, kwargs),
            "bits": kwargs.get("bits") if name in ("quantize", "sortquant", "lloydmax", "hadamard") else None,
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


def load_baseline(rev: str):
    """``get_compressor`` of ``lightning_epipe/compressors`` at git revision ``rev`` (or in the
    directory ``rev``, a copy of the tree at that revision, where there is no git history),
    loaded as the package ``baseline_compressors`` (its imports are relative, so it is whole)."""
    if Path(rev).is_dir():
        package = Path(rev) / "lightning_epipe" / "compressors"
    else:
        root = Path(__file__).resolve().parents[1]
        archive = subprocess.run(["git", "archive", rev, "lightning_epipe/compressors"], cwd=root,
                                 check=True, capture_output=True).stdout
        target = Path(tempfile.mkdtemp(prefix="baseline-"))
        atexit.register(shutil.rmtree, target, ignore_errors=True)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(target, filter="data")
        package = target / "lightning_epipe" / "compressors"
    spec = importlib.util.spec_from_file_location("baseline_compressors", package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_compressors"] = module
    spec.loader.exec_module(module)
    return module.get_compressor


def per_call_us(codec, x: torch.Tensor, calls: int) -> tuple[float, float]:
    """Mean (encode, decode) microseconds over ``calls`` calls each. On the CPU in CPU time of
    this thread: with one torch thread that is the work of the call, whatever else shares the
    cores (wall time on a loaded machine also counts the time other processes hold them). On
    a GPU in wall time up to the end of the last call's kernels."""
    clock, sync = (time.perf_counter if x.is_cuda else time.thread_time), synchronizer(x)
    sync()
    start = clock()
    packets = [codec.encode(x) for _ in range(calls)]
    sync()
    encoded = clock()
    for packet in packets:
        codec.decode(packet)
    sync()
    decoded = clock()
    return 1e6 * (encoded - start) / calls, 1e6 * (decoded - encoded) / calls


#: Tensor sizes of ``--overhead --cold`` (up to two micro-batches of 32 x 1024 float32).
COLD_SIZES = [n for n in OVERHEAD_SIZES if n <= 1 << 17]
#: Calls per round of ``--overhead --cold`` (each call follows a few ms of eviction).
COLD_CALLS = 10


class Evictor:
    """Other work between two codec calls, as a stage's forward or backward would do: a
    [64, 1024] x [1024, 1024] matmul and a pass over 16 MiB (CPU)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.a, self.w = torch.randn(64, 1024, generator=g), torch.randn(1024, 1024, generator=g)
        self.big = torch.zeros(4 << 20)

    def __call__(self) -> None:
        torch.relu_(self.a @ self.w)
        self.big.add_(1.0)


def per_call_cold_us(codec, x: torch.Tensor, calls: int, evict: Evictor) -> tuple[float, float]:
    """Mean (encode, decode) microseconds of ``calls`` calls each, every call timed alone (CPU
    time of this thread) right after ``evict()``."""
    encode = decode = 0.0
    for _ in range(calls):
        evict()
        start = time.thread_time()
        packet = codec.encode(x)
        encode += time.thread_time() - start
        evict()
        start = time.thread_time()
        codec.decode(packet)
        decode += time.thread_time() - start
    return 1e6 * encode / calls, 1e6 * decode / calls


def overhead(baseline_rev: str | None, rounds: int, budget_s: float, device: torch.device, cold: bool = False) -> dict:
    """Encode + decode us per call by codec and size; median of ``rounds`` rounds, each
    round timing the baseline and the current codec back to back on the same tensor.
    ``cold``: every call after other work (:class:`Evictor`), ``COLD_CALLS`` calls a round, CPU only."""
    makers = {"after": get_compressor}
    if baseline_rev:
        makers = {"before": load_baseline(baseline_rev), **makers}
    g = torch.Generator().manual_seed(0)
    rows = []
    evict = Evictor() if cold else None
    for nbytes in (COLD_SIZES if cold else OVERHEAD_SIZES):
        x = torch.relu(torch.randn(max(1, nbytes // 4 // 256), 256, generator=g)).to(device)
        for name, kwargs in OVERHEAD_CODECS:
            codecs = {k: make(name, **kwargs) for k, make in makers.items()}
            for c in codecs.values():  # warm up: caches, first-call allocations
                c.decode(c.encode(x))
            first = sum(per_call_us(codecs["after"], x, 1))
            calls = max(1, min(200, int(budget_s * 1e6 / max(first, 1.0))))
            if cold:  # "before": the same codec's calls back to back; "after": each after other work
                c = codecs["after"]
                timers = {"before": lambda: per_call_us(c, x, calls),
                          "after": lambda: per_call_cold_us(c, x, COLD_CALLS, evict)}
            else:
                timers = {k: (lambda c=c: per_call_us(c, x, calls)) for k, c in codecs.items()}
            times = {k: [] for k in timers}
            for _ in range(rounds):
                for k, timer in timers.items():
                    times[k].append(timer())
            row = {"bytes": nbytes, "codec": label(name, kwargs), "calls": calls}
            for k, v in times.items():  # medians over the rounds: of the sum, and of each direction
                row[f"{k}_us"] = statistics.median(encode + decode for encode, decode in v)
                row[f"{k}_encode_us"] = statistics.median(encode for encode, _ in v)
                row[f"{k}_decode_us"] = statistics.median(decode for _, decode in v)
            if "before_us" in row:
                row["ratio"] = row["after_us"] / row["before_us"]
            rows.append(row)
            print(overhead_line(row), flush=True)
    out = {"baseline": baseline_rev, "threads": torch.get_num_threads(), "rows": rows, "device": device_name(device)}
    if cold:
        out["cold"] = ("after: every call after a [64, 1024] x [1024, 1024] matmul and a pass over 16 MiB (not timed),"
                       f" {COLD_CALLS} calls a round; before: the same codec's calls back to back")
    return out


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def overhead_line(row: dict) -> str:
    size = row["bytes"]
    size_label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
    before = f"{row['before_us']:.0f}" if "before_us" in row else "-"
    ratio = f"{row['ratio']:.2f}" if "ratio" in row else "-"
    return f"| {size_label} | {row['codec']} | {before} | {row['after_us']:.0f} | {ratio} |"


#: Sizes (bytes) of the overhead summary table.
SUMMARY_SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 22, 1 << 26]


def overhead_summary(rows: list[dict]) -> str:
    """Per codec, us per call at ``SUMMARY_SIZES`` (ms from 10 ms on), with after / before in brackets."""
    sizes = [f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" for n in SUMMARY_SIZES]
    return _per_codec_table(rows, [(size, n, "") for size, n in zip(sizes, SUMMARY_SIZES)])


#: Sizes (bytes) of the small-tensor table, encode and decode apart.
SMALL_SIZES = [1 << 10, 1 << 12, 1 << 14]
#: Sizes (bytes) of the micro-batch table: 16 and 32 rows of 1024 float32 features.
MICROBATCH_SIZES = [1 << 16, 1 << 17]


def directions_summary(rows: list[dict], sizes: list[int] = SMALL_SIZES) -> str:
    """Per codec, encode and decode us per call at ``sizes``, with after / before in brackets."""
    return _per_codec_table(rows, [(f"{n >> 10} KiB {d}", n, f"{d}_") for n in sizes
                                   for d in ("encode", "decode")])


def _per_codec_table(rows: list[dict], columns: list[tuple[str, int, str]]) -> str:
    """A markdown table, a line per codec; ``columns``: (heading, tensor bytes, timing: "" for
    encode + decode, "encode_" or "decode_")."""
    def cell(row: dict | None, timing: str) -> str:
        if row is None:
            return "-"
        us, before = row[f"after_{timing}us"], row.get(f"before_{timing}us")
        text = f"{us / 1e3:.0f} ms" if us >= 1e4 else f"{us:.0f}"
        return f"{text} ({us / before:.2f})" if before else text

    lines = ["| codec | " + " | ".join(head for head, _, _ in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for codec in dict.fromkeys(r["codec"] for r in rows):
        at = {r["bytes"]: r for r in rows if r["codec"] == codec}
        lines.append(f"| {codec} | " + " | ".join(cell(at.get(n), timing) for _, n, timing in columns) + " |")
    return "\n".join(lines)


def load_line(load: tuple[float, float, float]) -> str:
    return f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores)"


def run_overhead(args: argparse.Namespace) -> None:
    if args.cold and (torch.device(args.device).type != "cpu" or args.baseline):
        raise SystemExit("--cold compares a codec's cold CPU calls with its calls back to back: leave out --device and --baseline")
    torch.set_num_threads(1)  # thread CPU time is the cost of a call only with one thread
    load_start = os.getloadavg()
    print(f"load average at start: {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}")
    print("| tensor | codec | before us/call | after us/call | after / before |")
    print("|---|---|---:|---:|---:|")
    result = overhead(args.baseline, args.rounds, args.budget, torch.device(args.device), cold=args.cold)
    load_end = os.getloadavg()
    print(f"load average at end: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    summary = [directions_summary(result["rows"]), directions_summary(result["rows"], MICROBATCH_SIZES)]
    if not args.cold:  # the by-size table reaches 64 MiB
        summary.insert(0, overhead_summary(result["rows"]))
    print("\n\n".join(summary))
    result.update(load_start=load_start, load_end=load_end, tensor="relu(randn) [n/256, 256]", summary=summary)
    out = Path(__file__).parent / "results" / args.overhead_out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--overhead", action="store_true",
                        help="per-call encode + decode time by tensor size (1 KiB..64 MiB)")
    parser.add_argument("--baseline", metavar="REV",
                        help="with --overhead: time the codecs of this git revision (or a copy of its tree) too")
    parser.add_argument("--overhead-out", default="compressors_overhead.json",
                        help="with --overhead: file name under benchmarks/results")
    parser.add_argument("--cold", action="store_true",
                        help="with --overhead: every call after other work (caches cold), tensors up to 128 KiB")
    parser.add_argument("--rounds", type=int, default=5,
                        help="with --overhead: rounds per codec and size (median taken)")
    parser.add_argument("--budget", type=float, default=0.02,
                        help="with --overhead: seconds of calls per round and codec")
    parser.add_argument("--full", action="store_true",
                        help="ReLU6 activation at [32, 32, 112, 112]")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per codec (best taken)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch CPU threads (default: all)")
    parser.add_argument("--device", default="cpu", help="where the tensors and codecs run, e.g. cuda")
    parser.add_argument("--out", type=Path, default=None,
                        help="plot path (default results/compressors.png, compressors_cuda.png on a GPU)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.out is None:
        suffix = "" if device.type == "cpu" else f"_{device.type}"
        args.out = Path(__file__).parent / "results" / f"compressors{suffix}.png"
    torch.set_num_threads(args.threads)
    if args.overhead:
        run_overhead(args)
        return
    load_before = os.getloadavg()
    print(load_line(load_before), flush=True)
    results = {name: measure(x.to(device), args.repeats) for name, x in tensors(args.full).items()}
    text = table(results)
    print(text)
    print(load_line(os.getloadavg()))
    plot(results, args.out)
    data = args.out.with_suffix(".json")
    data.write_text(json.dumps({"load_before": load_line(load_before), "load_after": load_line(os.getloadavg()),
                                "device": device_name(device),
                                "threads": torch.get_num_threads(), "repeats": args.repeats, "full": args.full,
                                "results": results, "table": text}, indent=1))
    print(f"\nwrote {args.out} and {data}")


if __name__ == "__main__":
    main()
