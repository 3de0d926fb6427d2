"""benchmarks/slow_link_auto.py without processes: its configuration, rows and table."""

from benchmarks.slow_link_auto import DEFAULT_METHODS, METHODS, RATES, config, paired_ratios, row, table


def test_the_issue_setting():
    cfg = config("auto", steps=20, warmup=5)
    assert (cfg["placement"], cfg["layers"], cfg["chunks"], cfg["devices"]) == ("client-server", {"width": 1024}, 8, 2)
    assert cfg["codec"] == {"compressor": "auto"} and RATES == [5, 20, 100, 1000, None]
    assert DEFAULT_METHODS == ["auto", "none", "sortquant-8", "lloydmax-4"]
    from lightning_epipe.compressors import available_compressors, get_compressor

    wrapper = {"delta"}  # delta_compression=True: a stream's deltas, in another codec
    shipped = {name for name in available_compressors()
               if type(get_compressor(name)).__module__.startswith("lightning_epipe.")} - wrapper
    assert {m["compressor"] for m in METHODS.values()} >= shipped


def test_rows_and_table_compare_auto_with_the_best_fixed_codec():
    ok = {"samples_per_s": 100.0, "steps": 10, "bytes": 1000, "ratio": 0.25}
    rows = [row(20, "auto", [ok | {"auto": {"activation/cut0": "fp16"}, "auto_decisions": [{"step": 1}]}]),
            row(20, "none", [ok | {"samples_per_s": 50.0}, {"error": "hung"}]),
            row(20, "sortquant-8", [ok | {"samples_per_s": 80.0}])]
    assert rows[1]["samples_per_s"] == [50.0] and rows[1]["errors"] == ["hung"]
    assert rows[0]["auto_decisions"] == [{"step": 1}] and rows[0]["bytes_per_step"] == 100
    lines = table(rows).splitlines()
    assert "| 20 | auto | 100 | 100-100 | 2.000x (2.000-2.000) | 0.250 | 1.25x | activation/cut0: fp16 |  |" in lines
    assert any(line.startswith("| 20 | none | 50 |") and line.endswith("| hung |") for line in lines)


def test_ratios_to_none_pair_the_repetitions_that_ran_side_by_side():
    def ok(sps):
        return {"samples_per_s": sps, "steps": 10, "bytes": 1000, "ratio": 1.0}

    none = row(None, "none", [ok(100.0), {"error": "hung"}, ok(200.0), ok(150.0)])
    codec = row(None, "fp16", [ok(95.0), ok(120.0), ok(190.0), {"error": "died"}])
    assert codec["by_repetition"] == [95.0, 120.0, 190.0, None]
    assert paired_ratios(codec, none) == [0.95, 0.95]   # repetition 2: none failed; 4: fp16 failed
    assert paired_ratios(codec, None) == [] and paired_ratios({"samples_per_s": [1.0]}, none) == []
    line = next(x for x in table([none, codec]).splitlines() if "| fp16 |" in x)
    assert "| 0.950x (0.950-0.950) |" in line    # the medians alone would read 120 / 150 = 0.80x
