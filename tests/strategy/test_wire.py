import pytest
import torch

from lightning_epipe.strategy.comm.wire import HEADER_LEN, Header, Kind, WireError, checksum


def _header(**kw):
    fields = dict(kind=Kind.ACTIVATION, step=3, microbatch=1, num_microbatches=4, index=0, count=2,
                  flags=0, payload_nbytes=100, crc=7)
    fields.update(kw)
    return Header(**fields)


def test_header_round_trip():
    h = _header()
    t = h.to_tensor()
    assert t.dtype == torch.int64 and t.numel() == HEADER_LEN
    assert Header.from_tensor(t, "link") == h


def test_corrupted_magic_is_rejected():
    t = _header().to_tensor()
    t[0] = 12345
    with pytest.raises(WireError, match="link rank 1 -> rank 2: not an epipe header"):
        Header.from_tensor(t, "link rank 1 -> rank 2")


@pytest.mark.parametrize(("index", "value", "match"), [(1, 99, "wire version"), (2, 42, "unknown message kind"), (9, -5, "payload size")])
def test_bad_fields_are_rejected(index, value, match):
    t = _header().to_tensor()
    t[index] = value
    with pytest.raises(WireError, match=match):
        Header.from_tensor(t, "link")


def test_expect_names_every_mismatch():
    with pytest.raises(WireError, match=r"step=3 \(expected 4\), microbatch=1 \(expected 0\)"):
        _header().expect("link", step=4, microbatch=0)
    with pytest.raises(WireError, match=r"kind=ACTIVATION \(expected GRADIENT\)"):
        _header().expect("link", kind=Kind.GRADIENT)


def test_checksum_detects_a_flipped_bit():
    payload = torch.arange(64, dtype=torch.uint8)
    before = checksum(payload)
    payload[10] ^= 1
    assert checksum(payload) != before
