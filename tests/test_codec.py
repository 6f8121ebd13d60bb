"""The gzip codec: isal when installed, zlib otherwise, and the same format either way."""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Iterator

import pytest

from profctx.util import _codec

DATA = b'{"traceEvents": [' + b",".join(b'{"ph": "X", "name": "aten::mm", "ts": %d, "dur": 3.5}' % i
                                        for i in range(20_000)) + b"]}"


@pytest.fixture(params=["installed", "stdlib"])
def codec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run a test with the codec as installed, then with isal hidden (the stdlib fallback)."""
    if request.param == "stdlib":
        monkeypatch.setattr(_codec, "_isal", None)
        monkeypatch.setattr(_codec, "_igzip", None)
    yield _codec.name()


@pytest.mark.parametrize("level", [1, 3, 6, 9])
def test_compress_is_read_by_the_standard_gzip_module(codec: str, level: int) -> None:
    packed = _codec.compress(DATA, level)
    assert gzip.decompress(packed) == DATA
    assert _codec.decompress(packed) == DATA
    assert len(packed) < len(DATA) // 5


def test_gzip_writer_output_is_read_by_the_standard_gzip_module(codec: str) -> None:
    out = io.BytesIO()
    with _codec.gzip_writer(out, 1) as dst:
        for i in range(0, len(DATA), 4096):
            dst.write(DATA[i:i + 4096])
    assert not out.closed  # the caller's file stays open
    assert gzip.decompress(out.getvalue()) == DATA


def test_deflater_and_inflater_stream_with_an_output_cap(codec: str) -> None:
    zipper = _codec.deflater(1)
    packed = zipper.compress(DATA) + zipper.flush()
    unzip = _codec.inflater()
    out = bytearray()
    pending = packed
    while not unzip.eof:
        piece = unzip.decompress(pending, 4096)
        assert len(piece) <= 4096  # the cap holds: a small input cannot inflate past it in one call
        out += piece
        pending = unzip.unconsumed_tail
    assert bytes(out) == DATA


def test_stdlib_output_is_read_and_members_follow_one_another(codec: str) -> None:
    packed = gzip.compress(DATA[:1000], 9) + gzip.compress(DATA[1000:], 1)
    assert _codec.decompress(packed) == DATA


def test_damage_raises_a_codec_error(codec: str) -> None:
    packed = bytearray(gzip.compress(DATA, 1))
    packed[40:60] = b"\xff" * 20
    with pytest.raises(_codec.ERRORS):
        _codec.decompress(bytes(packed))
    with pytest.raises(_codec.ERRORS):
        _codec.decompress(gzip.compress(DATA)[:-100])  # cut short


def test_name_says_which_library(codec: str) -> None:
    assert codec in ("isal", "zlib")
    if codec == "zlib":
        assert isinstance(_codec.inflater(), type(zlib.decompressobj(31)))
