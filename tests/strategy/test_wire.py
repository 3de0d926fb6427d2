import pytest
import torch

from lightning_epipe.strategy.comm.wire import HEADER_LEN, ClipAlgorithm, Command, Header, Kind, WireError, checksum


def _header(**kw):
    fields = dict(kind=Kind.ACTIVATION, step=3, microbatch=1, num_microbatches=4, index=0, count=2,
                  flags=0, payload_nbytes=100, checksum=-7)
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


@pytest.mark.parametrize("nbytes", [1, 63, 64, 4097])
def test_checksum_detects_a_flipped_bit(nbytes):
    payload = torch.arange(nbytes, dtype=torch.uint8)
    before = checksum(payload)
    for at in {0, nbytes // 2, nbytes - 1}:
        payload[at] ^= 1
        assert checksum(payload) != before, at
        payload[at] ^= 1
    assert checksum(payload) == before


def test_checksum_travels_in_the_header_as_a_signed_word():
    """XXH3-64 digests span all 64 bits; the header's int64 word holds each one exactly."""
    digests = {checksum(torch.tensor([i & 255, i >> 8], dtype=torch.uint8)) for i in range(512)}
    assert any(d < 0 for d in digests) and any(d > 0 for d in digests)
    for d in digests:
        assert -(1 << 63) <= d < 1 << 63
        h = _header(checksum=d)
        assert Header.read(_frame(h), "link").checksum == d


def _frame(header: Header) -> torch.Tensor:
    frame = torch.zeros(HEADER_LEN * 8, dtype=torch.uint8)
    header.write(frame)
    return frame


@pytest.mark.parametrize("value", [1e-300, 0.05, 1.0, 3.5e38, float("inf")])
@pytest.mark.parametrize("algorithm", list(ClipAlgorithm))
def test_clip_command_carries_its_value_exactly(value, algorithm):
    """Manual optimization's clip: optimizer, algorithm and the float64 value survive the header."""
    h = Header.clip(5, 2, algorithm, value).framed(0)
    got = Header.from_tensor(h.to_tensor(), "link")
    assert (got.arg, got.microbatch) == (Command.CLIP_GRADIENTS, 2)
    assert got.clip_args("link") == (algorithm, value)


@pytest.mark.parametrize("value", [0.0, -0.5, float("nan")])
def test_clip_command_refuses_a_value_lightning_would_not_clip_with(value):
    with pytest.raises(ValueError, match="clip value must be positive"):
        Header.clip(5, 0, ClipAlgorithm.NORM, value)


@pytest.mark.parametrize(("field", "value"), [("flags", 2), ("num_microbatches", 0), ("num_microbatches", 9221120237041090560)])
def test_corrupted_clip_command_names_the_link(field, value):
    """An algorithm or value a clip header never carries (here 2, 0.0 and a NaN's bits) is a WireError."""
    h = Header.clip(5, 0, ClipAlgorithm.NORM, 0.5)._replace(**{field: value})
    with pytest.raises(WireError, match="link rank 0 -> rank 1: CLIP_GRADIENTS with algorithm .* the stream is corrupted"):
        h.clip_args("link rank 0 -> rank 1")
