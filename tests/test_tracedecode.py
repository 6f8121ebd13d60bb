"""The typed event decoder: the fields readers need, with or without msgspec, never stopped by an odd event."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from profctx.analysis import _tracedecode
from profctx.analysis._tracedecode import (
    Decoder,
    Heads,
    MalformedError,
    Unchecked,
    as_event,
    checked,
    correlation,
    correlations,
    heads,
    heads_or_values,
    raws,
)
from profctx.analysis._tracedecode import events as decode

FIELDS = ("ph", "name", "cat", "ts", "dur", "pid", "tid")

TORCH_EVENT = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 8131, "tid": 8131, "ts": 4786651186709.856,
               "dur": 657.043, "args": {"External id": 4, "Record function id": 0, "Input Dims": [[64, 64], [64, 64]]}}


def fields(event: Any) -> tuple[Any, ...]:
    return tuple(getattr(event, f) for f in FIELDS)


def events(data: bytes) -> list[Any]:
    """Decode, each event made typed (what a reader does with the dicts of a batch the fallback parser made)."""
    got = decode(data)
    return [as_event(e) for e in got] if type(got) is Unchecked else [checked(e) for e in got]


def dumps(values: list[Any]) -> bytes:
    return json.dumps(values).encode()


@pytest.fixture(params=["typed", "fallback"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run a test with msgspec as installed, then with its decoders hidden (the fallback parser)."""
    if request.param == "fallback":
        for attr in ("_EVENTS", "_HEADS", "_RAWS"):
            monkeypatch.setattr(_tracedecode, attr, None)
    yield request.param


def test_a_torch_event_gives_its_seven_fields(decoder: str) -> None:
    metadata = {"ph": "M", "name": "process_name", "pid": "Spans", "tid": 0, "ts": 5, "args": {"name": "x"}}
    got = events(dumps([TORCH_EVENT, metadata, {"ph": "i", "s": "g"}]))
    assert [fields(e) for e in got] == [
        ("X", "aten::mm", "cpu_op", 4786651186709.856, 657.043, 8131, 8131),
        ("M", "process_name", None, 5.0, None, "Spans", 0),
        ("i", None, None, None, None, None, None),
    ]
    assert type(got[1].ts) is float  # an integer time is a float, as the struct says


def test_an_odd_event_loses_only_its_odd_fields(decoder: str) -> None:
    odd = [TORCH_EVENT, {"ph": "X", "name": 7, "ts": "12", "dur": True, "pid": [1], "tid": 2.5}, 3, "x", None,
           TORCH_EVENT]
    got = events(dumps(odd))
    assert len(got) == 3  # the values that are not objects are left out, the rest read
    assert fields(got[1]) == ("X", "7", None, None, None, "[1]", "2.5")
    assert fields(got[0]) == fields(got[2]) == fields(events(dumps([TORCH_EVENT]))[0])


KERNEL = {"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": 5.0, "dur": 2.0,
          "args": {"External id": 4, "device": 0, "stream": 7, "correlation": 11, "grid": [8, 16, 1]}}


def test_linked_events_carry_the_correlation_and_only_that(decoder: str) -> None:
    batch = [KERNEL, TORCH_EVENT, {"ph": "X", "args": {"correlation": "11"}}, {"ph": "X", "args": [1]},
             {"ph": "X", "args": {"correlation": True}}]
    got = decode(dumps(batch), linked=True)
    linked = [as_event(e) for e in got] if type(got) is Unchecked else got
    # A correlation that is no integer is no link (msgspec then leaves the batch to the fallback parser).
    assert [correlation(e) for e in linked] == [11, None, None, None, None]
    assert correlations(got, type(got) is Unchecked) == [11, None, None, None, None]
    assert fields(linked[0]) == ("X", "sgemm", "kernel", 5.0, 2.0, 0, 7)
    plain = decode(dumps([KERNEL]))
    assert [correlation(e if type(plain) is not Unchecked else as_event(e)) for e in plain] == (
        [None] if decoder == "typed" else [11])  # only a linked decode reads args; parsed dicts hold them all


def test_a_decoder_reads_correlations_once_linked(decoder: str) -> None:
    decode_one = Decoder()
    first = decode_one(dumps([KERNEL]))
    decode_one.linked = True
    second = decode_one(dumps([KERNEL]))
    if decoder == "typed":
        assert correlations(first, False) == [None] and correlations(second, False) == [11]
    else:
        assert correlations(first, True) == correlations(second, True) == [11]


def test_malformed_json_raises_a_value_error_with_its_position(decoder: str) -> None:
    text = b'[{"ph": "X", "ts": 1}, {"ph": "X", "ts: 2}]'
    with pytest.raises(MalformedError) as caught:
        events(text)
    assert isinstance(caught.value, ValueError)
    with pytest.raises(ValueError):
        events(b'{"ph": "X"}')  # not an array


def test_nesting_past_the_interpreter_is_malformed_not_a_crash(decoder: str) -> None:
    deep = b'[{"ph": "X", "args": ' + b"[" * 50_000 + b"]" * 50_000 + b"}]"
    with pytest.raises(MalformedError):
        events(deep)
    with pytest.raises(MalformedError):
        raws(deep) if decoder == "typed" else events(deep)
    assert heads(deep) is None


def test_heads_and_raws_split_a_batch_for_copying(decoder: str) -> None:
    batch = [TORCH_EVENT, {"ph": "f", "id": 3, "pid": 1, "tid": 1, "bp": "e"}]
    text = dumps(batch)
    got = heads(text)
    texts = raws(text)
    if decoder == "fallback":
        assert got is None and texts is None
        return
    assert got is not None and texts is not None
    assert [(h.ph, h.pid, h.tid) for h in got] == [("X", 8131, 8131), ("f", 1, 1)]
    assert [json.loads(bytes(t)) for t in texts] == batch
    assert json.loads(b"[" + b",".join(texts) + b"]") == batch
    assert heads(dumps([TORCH_EVENT, 4])) is None  # not every value an object: the caller parses them
    assert heads(dumps([{"ph": "X", "pid": 1.5}])) is None


def test_heads_or_values_parses_what_msgspec_does_not_take(decoder: str) -> None:
    plain = heads_or_values(dumps([TORCH_EVENT]))
    assert (type(plain) is Heads) == (decoder == "typed")
    # A time beyond a double fails the heads, as it fails the fallback parser: a value error either way.
    with pytest.raises(ValueError):
        heads_or_values(b'[{"ph": "X", "pid": 1, "tid": 1, "ts": 1e999}]')
    odd = heads_or_values(dumps([TORCH_EVENT, 5]))
    assert type(odd) is list and odd == [TORCH_EVENT, 5]


def test_the_fallback_without_msgspec_installed(tmp_path: Any) -> None:
    code = (
        "import sys; sys.modules['msgspec'] = None\n"
        "from profctx.analysis import _tracedecode as d\n"
        "assert not d.typed()\n"
        "e = d.events(b'[{\"ph\": \"X\", \"ts\": 1, \"pid\": 2}, 5]')\n"
        "assert type(e) is d.Unchecked and e == [{'ph': 'X', 'ts': 1, 'pid': 2}], e\n"
        "assert d.heads(b'[]') is None and d.raws(b'[]') is None\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.text(max_size=5),
                    st.floats(allow_nan=False, allow_infinity=False))
_value = st.one_of(_scalar, st.lists(_scalar, max_size=2))
_event = st.one_of(
    st.dictionaries(st.sampled_from([*FIELDS, "args", "id"]), _value, max_size=8),
    _scalar,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_event, max_size=8))
@example([{"ph": None, "name": -9223372036854775809}])  # found by this test: a name past 64 bits
def test_the_typed_decoder_agrees_with_converting_parsed_values(batch: list[Any]) -> None:
    text = dumps(batch)
    try:
        got = [fields(e) for e in events(text)]
        # The values as the fallback parser gives them (orjson reads an integer past 64 bits as a float).
        parsed = _tracedecode._fallback_loads(text)
    except (MalformedError, ValueError):
        return  # JSON the fallback parser refuses (orjson: an integer too large for a double)
    expected = [fields(e) for e in map(as_event, parsed) if e is not None]
    assert got == expected
