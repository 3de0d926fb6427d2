import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_epipe.compressors import cache_blocks
from lightning_epipe.compressors.bitpack import (MAX_WIDTH, lookup_packed, pack, pack_into, packed_nbytes,
                                                 unpack, unpack_range)


def random_codes(count: int, width: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2**width, (count,), generator=g, dtype=torch.int64)


@pytest.mark.parametrize("width", range(1, MAX_WIDTH + 1))
@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 1001])
def test_round_trip_every_width(width, count):
    codes = random_codes(count, width)
    packed = pack(codes, width)
    assert packed.dtype == torch.uint8 and packed.numel() == packed_nbytes(count, width)
    assert packed.numel() == -(-count * width // 8)
    assert torch.equal(unpack(packed, width, count).long(), codes)


@pytest.mark.parametrize("width", [1, 3, 8, 12, 16])
def test_extremes_round_trip(width):
    codes = torch.tensor([0, 2**width - 1] * 5)
    assert torch.equal(unpack(pack(codes, width), width, 10).long(), codes)


def test_layout_is_literal():
    # 3-bit codes 1..5: bits 001 010 011 100 101 little-endian in one 24-bit group
    assert pack(torch.tensor([1, 2, 3, 4, 5]), 3).tolist() == [0b11010001, 0b1011000]
    # 12-bit codes: the low bytes, then the high nibbles two to a byte
    assert pack(torch.tensor([0xABC, 0x123]), 12).tolist() == [0xBC, 0x23, 0x1A]
    assert pack(torch.tensor([1, 0, 1, 1, 0, 0, 0, 1, 1]), 1).tolist() == [0b10001101, 1]


def test_accepts_narrow_code_dtypes():
    codes = torch.tensor([3, 0, 2, 1], dtype=torch.uint8)
    assert torch.equal(unpack(pack(codes, 2), 2, 4), codes.int())


@pytest.mark.parametrize("width", [3, 8, 13, 24])
def test_cache_blocks_compose(width, monkeypatch):
    """Packing chunk by chunk gives the bytes of packing at once, for any chunk size."""
    codes = random_codes(1003, width, seed=1)
    whole = pack(codes, width)
    monkeypatch.setattr(cache_blocks, "CHUNK", 64)
    assert torch.equal(pack(codes, width), whole)
    assert torch.equal(unpack(whole, width, 1003).long(), codes)
    out = torch.empty_like(whole)
    for start in range(0, 1003, 200):
        pack_into(codes[start:start + 200], width, out, start, 1003)
    assert torch.equal(out, whole)
    assert torch.equal(unpack_range(whole, width, 1003, 400, 600).long(), codes[400:600])


def test_pack_into_a_given_buffer():
    out = torch.zeros(10, dtype=torch.uint8)
    pack(torch.arange(16), 4, out=out[2:])
    assert out[:2].tolist() == [0, 0]
    assert torch.equal(unpack(out[2:], 4, 16), torch.arange(16).int())
    with pytest.raises(ValueError, match="out has 3 bytes"):
        pack(torch.arange(16), 4, out=out[:3])


@pytest.mark.parametrize("width", [0, 33, 2.0, True])
def test_bad_width(width):
    with pytest.raises(ValueError, match="width must be an integer in 1..32"):
        pack(torch.arange(3), width)


def test_unpack_wrong_size():
    with pytest.raises(ValueError, match="10 codes of 3 bits take 4 bytes, got 5"):
        unpack(torch.zeros(5, dtype=torch.uint8), 3, 10)


@settings(max_examples=40, deadline=None)
@given(width=st.integers(1, 16), codes=st.lists(st.integers(0, 2**16 - 1), max_size=80))
def test_round_trip_property(width, codes):
    codes = torch.tensor(codes, dtype=torch.int64) % (2**width)
    packed = pack(codes, width)
    assert packed.numel() == (codes.numel() * width + 7) // 8
    assert torch.equal(unpack(packed, width, codes.numel()).long(), codes)


@pytest.mark.parametrize("width", [1, 2, 4])
@pytest.mark.parametrize("count", [1, 7, 8, 9, 1001, 300_000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_lookup_packed_is_the_table_at_the_unpacked_codes(width, count, dtype):
    codes = torch.randint(0, 1 << width, (count,), generator=torch.Generator().manual_seed(count))
    table = torch.randn(1 << width, generator=torch.Generator().manual_seed(width)).to(dtype)
    got = lookup_packed(table, pack(codes, width), width, count)
    assert got.dtype == dtype and torch.equal(got, table[codes])


@pytest.mark.parametrize("width", [3, 5, 8, 12])
def test_lookup_packed_reads_only_whole_byte_widths(width):
    with pytest.raises(ValueError, match="lookup_packed reads widths"):
        lookup_packed(torch.zeros(1 << width), pack(torch.zeros(8, dtype=torch.int64), width), width, 8)
