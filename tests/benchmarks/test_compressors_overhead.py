"""The per-call overhead table of benchmarks/compressors.py (no timings asserted)."""

import time

import torch

from benchmarks.compressors import (
    Evictor, directions_summary, load_baseline, overhead_line, overhead_summary, per_call_cold_us, per_call_us,
)


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


def test_directions_summary_shows_encode_and_decode_apart():
    rows = [{"bytes": 1 << 10, "codec": "sortquant bits=8", "after_encode_us": 46.0, "after_decode_us": 17.0,
             "before_encode_us": 92.0, "before_decode_us": 17.0},
            {"bytes": 1 << 14, "codec": "sortquant bits=8", "after_encode_us": 94.4, "after_decode_us": 24.0},
            {"bytes": 1 << 26, "codec": "sortquant bits=8", "after_encode_us": 9e4, "after_decode_us": 1e4}]
    lines = directions_summary(rows).splitlines()
    assert lines[0] == ("| codec | 1 KiB encode | 1 KiB decode | 4 KiB encode | 4 KiB decode | 16 KiB encode"
                        " | 16 KiB decode |")
    assert lines[2] == "| sortquant bits=8 | 46 (0.50) | 17 (1.00) | - | - | 94 | 24 |"


class SlowDecode:
    """A codec whose decode takes 2 ms of CPU time and whose encode takes none."""

    def encode(self, x):
        return x

    def decode(self, packet):
        end = time.thread_time() + 0.002
        while time.thread_time() < end:
            pass
        return packet


def test_per_call_us_times_encode_and_decode_apart():
    encode_us, decode_us = per_call_us(SlowDecode(), torch.zeros(4), calls=3)
    assert decode_us >= 2000 > encode_us


def test_cold_calls_time_encode_and_decode_apart_and_leave_out_the_eviction():
    evictions = []

    def evict():
        evictions.append(1)
        end = time.thread_time() + 0.005  # not timed
        while time.thread_time() < end:
            pass

    encode_us, decode_us = per_call_cold_us(SlowDecode(), torch.zeros(4), 3, evict)
    assert len(evictions) == 6 and 2000 <= decode_us < 4000 and encode_us < 2000


def test_the_evictor_runs_a_stage_worth_of_work():
    evict = Evictor()
    before = evict.big[0].item()
    evict()
    assert evict.big[0].item() == before + 1 and evict.big.numel() * 4 == 16 << 20
