"""The per-call overhead table of benchmarks/compressors.py (no timings asserted)."""

import torch

from benchmarks.compressors import load_baseline, overhead_line


def test_a_baseline_revision_loads_apart_and_encodes():
    """The codecs of HEAD load under another package name, with their own registry."""
    get_baseline = load_baseline("HEAD")
    codec = get_baseline("quantize", bits=8)
    assert type(codec).__module__.startswith("baseline_compressors.")
    x = torch.linspace(-1, 1, 64)
    assert (codec.decode(codec.encode(x)) - x).abs().max() <= 1 / 255 + 1e-6


def test_overhead_line_shows_size_times_and_ratio():
    row = {"bytes": 1 << 20, "codec": "quantize bits=8", "before_us": 200.0, "after_us": 50.0,
           "ratio": 0.25}
    assert overhead_line(row) == "| 1 MiB | quantize bits=8 | 200 | 50 | 0.25 |"
    assert overhead_line({"bytes": 4096, "codec": "none", "after_us": 3.0}) == (
        "| 4 KiB | none | - | 3 | - |")
