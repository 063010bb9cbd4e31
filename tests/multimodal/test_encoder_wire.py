"""encoder_wire: tensors travel as raw bytes and come back bit for bit (every dtype); a body
cut, flipped, or whose shapes do not add up is refused, never read as other numbers."""
import pytest
import torch

from mimo.multimodal import encoder_wire as ew


def test_request_and_reply_round_trip_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    items = [ew.EncodeItem("a:fp", (1, 4, 4), torch.randn(16, 12, generator=g)),
             ew.EncodeItem("b:fp:salt:x", (2, 2, 4), torch.randn(16, 12, generator=g))]
    fp, got = ew.decode_request(ew.encode_request("tower", items))
    assert fp == "tower" and [(i.key, i.grid) for i in got] == [("a:fp", (1, 4, 4)),
                                                                 ("b:fp:salt:x", (2, 2, 4))]
    assert all(torch.equal(x.pixels, y.pixels) for x, y in zip(got, items))
    embeds = [torch.randn(4, 8, generator=g).to(dt)
              for dt in (torch.float32, torch.bfloat16, torch.float16)]
    embeds.append(torch.empty(0, 8))
    back = ew.decode_reply(ew.encode_reply(ew.EncodeReply("tower", [True, False, True, False],
                                                          embeds)))
    assert back.fingerprint == "tower" and back.hit == [True, False, True, False]
    for x, y in zip(back.embeds, embeds):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))


def test_damaged_frames_are_refused():
    body = ew.encode_request("t", [ew.EncodeItem("k", (1, 2, 2), torch.ones(4, 6))])
    with pytest.raises(ew.WireError, match="CRC"):
        ew.decode_request(body[:-5] + body[-4:])           # a byte short
    flipped = bytearray(body)
    flipped[40] ^= 1
    with pytest.raises(ew.WireError, match="CRC"):
        ew.decode_request(bytes(flipped))
    with pytest.raises(ew.WireError, match="magic"):
        ew.decode_reply(body)                              # a request is not a reply
    import json
    import struct
    import zlib
    header = json.dumps({"fingerprint": "t", "items": [
        {"key": "k", "grid": [1, 2, 2], "dtype": "float32", "shape": [5, 6]}]}).encode()
    raw = ew.MAGIC_REQ + struct.pack("<I", len(header)) + header + bytes(4 * 24)
    with pytest.raises(ew.WireError, match="run past"):   # 5 x 6 floats declared, 4 x 6 sent
        ew.decode_request(raw + struct.pack("<I", zlib.crc32(raw)))


def test_a_probe_carries_keys_only():
    body = ew.encode_probe("t", [("k1", (1, 2, 2)), ("k2", (2, 4, 4))])
    fp, items = ew.decode_request(body)
    assert fp == "t" and [(i.key, i.grid, i.pixels) for i in items] == [
        ("k1", (1, 2, 2), None), ("k2", (2, 4, 4), None)]
    with pytest.raises(ew.WireError, match="carries pixels"):
        ew.encode_request("t", items)
    import json
    import struct
    import zlib
    header = json.dumps({"fingerprint": "t", "probe": True,
                         "items": [{"key": "k", "grid": [1, 2, 2]}]}).encode()
    raw = ew.MAGIC_REQ + struct.pack("<I", len(header)) + header + bytes(8)
    with pytest.raises(ew.WireError, match="no tensor bytes"):
        ew.decode_request(raw + struct.pack("<I", zlib.crc32(raw)))
