import struct

import pytest
import torch

from lightning_epipe.compressors import Packet, PacketError
from lightning_epipe.compressors.packet import DTYPE_CODES, MAX_NDIM, header_nbytes


def packet(shape=(2, 3), payload_nbytes=5, codec=0, dtype=torch.float32) -> Packet:
    return Packet(codec, dtype, torch.Size(shape), torch.arange(payload_nbytes, dtype=torch.uint8))


def test_header_size_depends_only_on_ndim():
    assert [header_nbytes(d) for d in (0, 1, 4)] == [16, 24, 48]
    p = packet((2, 3), 5)
    assert p.nbytes == 16 + 2 * 8 + 5 == p.to_bytes().numel()


def test_header_layout_is_literal():
    buf = packet((2, 3), 5, codec=4, dtype=torch.bfloat16).to_bytes()
    assert bytes(buf[:16].tolist()) == b"EP" + bytes([2, 4, 7, 2, 0, 0]) + struct.pack("<Q", 5)
    assert struct.unpack("<2q", bytes(buf[16:32].tolist())) == (2, 3)
    assert buf[32:].tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("shape", [(), (0,), (4,), (2, 0, 3), tuple([1] * MAX_NDIM)])
@pytest.mark.parametrize("dtype", list(DTYPE_CODES))
def test_round_trip_every_dtype_and_shape(shape, dtype):
    p = packet(shape, 3, dtype=dtype)
    q = Packet.from_bytes(p.to_bytes())
    assert (q.codec, q.dtype, q.shape) == (p.codec, p.dtype, p.shape)
    assert torch.equal(q.payload, p.payload)


def test_from_bytes_payload_is_a_view_of_the_buffer():
    buf = packet().to_bytes()
    assert Packet.from_bytes(buf).payload.data_ptr() == buf.data_ptr() + 32


def corrupt(offset: int, value: int) -> torch.Tensor:
    buf = packet().to_bytes().clone()
    buf[offset] = value
    return buf


@pytest.mark.parametrize("buf, message", [
    (corrupt(0, ord("X")), "bad magic"),
    (corrupt(2, 9), "version 9"),
    (corrupt(3, 250), "unknown codec id 250"),
    (corrupt(4, 200), "unknown dtype code 200"),
    (corrupt(5, MAX_NDIM + 1), f"ndim {MAX_NDIM + 1}"),
    (corrupt(6, 1), "reserved"),
    (corrupt(5, 3), "header says"),                       # one more dim than sent
    (corrupt(23, 0x80), "negative dimension"),           # top byte of dim 0
    (packet().to_bytes()[:-1], "header says"),           # truncated payload
    (torch.cat([packet().to_bytes(), torch.zeros(1, dtype=torch.uint8)]), "header says"),
    (packet().to_bytes()[:10], "shorter than the 16-byte"),
    (torch.zeros(0, dtype=torch.uint8), "shorter"),
])
def test_from_bytes_rejects(buf, message):
    with pytest.raises(PacketError, match=message):
        Packet.from_bytes(buf)


@pytest.mark.parametrize("buf", [packet().to_bytes().int(), packet().to_bytes().view(1, -1), b"EP"])
def test_from_bytes_wants_a_1d_uint8_tensor(buf):
    with pytest.raises(PacketError, match="1-D uint8"):
        Packet.from_bytes(buf)


@pytest.mark.parametrize("kwargs, message", [
    ({"codec": 256}, "codec id"),
    ({"dtype": torch.quint8}, "no wire code"),
    ({"shape": [1] * (MAX_NDIM + 1)}, "ndim"),
    ({"payload": torch.zeros(4, dtype=torch.int8)}, "1-D contiguous uint8"),
    ({"payload": torch.zeros(2, 2, dtype=torch.uint8)}, "1-D contiguous uint8"),
    ({"payload": torch.zeros(8, dtype=torch.uint8)[::2]}, "1-D contiguous uint8"),
])
def test_packet_checks_its_fields(kwargs, message):
    fields = {"codec": 0, "dtype": torch.float32, "shape": (2,),
              "payload": torch.zeros(8, dtype=torch.uint8), **kwargs}
    with pytest.raises(PacketError, match=message):
        Packet(**fields)


def test_shape_becomes_torch_size():
    assert isinstance(Packet(0, torch.float32, (2,), torch.zeros(8, dtype=torch.uint8)).shape,
                      torch.Size)
