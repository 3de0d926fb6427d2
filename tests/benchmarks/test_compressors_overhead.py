"""The per-call overhead table of benchmarks/compressors.py (no timings asserted)."""

import torch

from benchmarks.compressors import load_baseline, overhead_line, overhead_summary


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


def test_overhead_summary_has_a_column_per_summary_size():
    rows = [{"bytes": 1 << 10, "codec": "none", "after_us": 20.0, "before_us": 20.0, "ratio": 1.0},
            {"bytes": 1 << 26, "codec": "none", "after_us": 37000.0},
            {"bytes": 1 << 10, "codec": "quantize bits=8", "after_us": 68.4}]
    lines = overhead_summary(rows).splitlines()
    assert lines[0] == "| codec | 1 KiB | 16 KiB | 256 KiB | 4 MiB | 64 MiB |"
    assert lines[2] == "| none | 20 (1.00) | - | - | - | 37 ms |"
    assert lines[3] == "| quantize bits=8 | 68 | - | - | - | - |"
