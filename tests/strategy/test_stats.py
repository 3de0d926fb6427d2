import pytest

from lightning_epipe.strategy.engine.stats import LinkCounter, LinkKey, PipelineStats


def test_link_counter_ratio_and_peak():
    c = LinkCounter()
    c.add(100, 400, seconds=0.5)
    c.add(300, 400, seconds=0.1)
    assert c.ratio == pytest.approx(0.5)
    assert c.peak_bytes_per_second == pytest.approx(3000)
    assert LinkCounter.from_list(c.as_list()) == c


def test_totals_and_bubble():
    s = PipelineStats()
    s.link(LinkKey("send", 1, "activation")).add(10, 40)
    s.link(LinkKey("recv", 2, "gradient")).add(20, 40)
    s.add_compute(0, 3.0)
    s.wait_seconds = 1.0
    assert s.total("send").bytes == 10
    assert s.total(kind="gradient").raw_bytes == 40
    assert s.bubble_fraction == pytest.approx(0.25)
    assert LinkKey("recv", 2, "gradient").label(0) == "gradient/2->0"
    s.reset()
    assert s.links == {} and s.bubble_fraction == 0.0
