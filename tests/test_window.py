"""StepWindow: accepted forms, refusals, runs, converters."""

from __future__ import annotations

import itertools
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from profctx import ConfigError, StepWindow
from profctx.core._window import MAX_STEPS
from profctx.testing import strategies as pst


@pytest.mark.parametrize(
    ("value", "steps"),
    [
        ([1, 2, 5], (1, 2, 5)),
        ("3:6", (3, 4, 5)),
        ("10:40:10", (10, 20, 30)),
        (":3", (0, 1, 2)),
        ("1,2,5", (1, 2, 5)),
        (" 7 ", (7,)),
        (7, (7,)),
        (range(2, 8, 3), (2, 5)),
        ((5, 1, 5), (1, 5)),
    ],
)
def test_accepted_forms(value: object, steps: tuple[int, ...]) -> None:
    assert StepWindow.parse(value).steps == steps


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("3:", "unbounded"),
        ("3:1", "greater than the start"),
        ("1:5:0", "stride"),
        ("a:b", "half-open slice"),
        ("1:2:3:4", "half-open slice"),
        ([1, -2], "integers >= 0"),
        ([1.5], "integers"),
        (True, "half-open slice"),
        ({"a": 1}, "half-open slice"),
        (None, "half-open slice"),
        ("", "half-open slice"),
    ],
)
def test_refused_forms_name_field_value_and_allowed(value: object, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        StepWindow.parse(value)
    message = str(info.value)
    assert message.startswith("steps: ")
    assert repr(value) in message or str(value) in message
    assert needle in message


def test_huge_window_refused() -> None:
    with pytest.raises(ConfigError, match="at most"):
        StepWindow.parse("0:1000000000")


@pytest.mark.parametrize(
    "value",
    [range(10**30), range(0, 10**30, 7), "0:" + "9" * 40, [0] * 200_000, set(range(MAX_STEPS + 1))],
    ids=["range-past-ssize_t", "strided-range-past-ssize_t", "slice-past-ssize_t", "long-list", "large-set"],
)
def test_oversized_windows_are_refused_without_expanding_them(value: object) -> None:
    with pytest.raises(ConfigError, match=f"at most {MAX_STEPS} steps"):
        StepWindow.parse(value)


@pytest.mark.parametrize("value", [b"3:6", bytearray(b"3:6"), memoryview(b"3:6")])
def test_bytes_are_not_read_as_character_codes(value: object) -> None:
    # b"3:6" iterates as 51, 58, 54: it once became steps 51, 54, 58.
    with pytest.raises(ConfigError, match="half-open slice"):
        StepWindow.parse(value)


def test_an_endless_iterator_is_refused_not_consumed() -> None:
    with pytest.raises(ConfigError, match="a list of steps"):
        StepWindow.parse(itertools.count())


def test_mixed_item_types_are_a_config_error_not_a_type_error() -> None:
    with pytest.raises(ConfigError, match="integers >= 0"):
        StepWindow(["a", 1])  # type: ignore[list-item]


def test_runs_and_run_of() -> None:
    window = StepWindow.parse([1, 2, 3, 5, 8, 9])
    assert window.runs() == ((1, 2, 3), (5,), (8, 9))
    assert window.run_of(2) == (1, 2, 3)
    assert window.run_of(9) == (8, 9)
    assert window.run_of(4) is None


@given(pst.windows())
def test_runs_partition_the_window(window: StepWindow) -> None:
    runs = window.runs()
    assert tuple(s for run in runs for s in run) == window.steps
    for run in runs:
        assert list(run) == list(range(run[0], run[-1] + 1))
        for step in run:
            assert window.run_of(step) == run
    for a, b in itertools.pairwise(runs):
        assert b[0] > a[-1] + 1


@given(pst.windows())
def test_value_semantics(window: StepWindow) -> None:
    assert StepWindow.parse(window.describe()) == window
    assert StepWindow.parse(list(window)) == window
    assert hash(StepWindow(window.steps)) == hash(window)
    assert pickle.loads(pickle.dumps(window)) == window
    assert window.first == min(window) and window.last == max(window)
    assert all(window.contains(s) for s in window)


@given(pst.windows(), st.integers(0, 80))
def test_contains_matches_membership(window: StepWindow, step: int) -> None:
    assert window.contains(step) == (step in set(window.steps))


def test_from_verl_steps_list() -> None:
    assert StepWindow.from_verl([1, 2, 5]).steps == (1, 2, 5)
    assert not StepWindow.from_verl(None)
    with pytest.raises(ConfigError, match=r"global_profiler\.steps"):
        StepWindow.from_verl([0, -1])


@given(
    wait=st.integers(0, 4),
    warmup=st.integers(0, 3),
    active=st.integers(1, 5),
    repeat=st.integers(1, 4),
    skip_first=st.integers(0, 5),
    first_step=st.integers(0, 3),
)
def test_torch_schedule_round_trip(
    wait: int, warmup: int, active: int, repeat: int, skip_first: int, first_step: int
) -> None:
    window = StepWindow.from_torch_schedule(
        wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first, first_step=first_step
    )
    assert len(window) == active * repeat
    kwargs = window.to_torch_schedule(first_step=first_step, warmup=warmup)
    assert StepWindow.from_torch_schedule(**kwargs, first_step=first_step) == window


def test_torch_schedule_matches_torch() -> None:
    torch_profiler = pytest.importorskip("torch.profiler")
    window = StepWindow.parse("10:40:10")
    kwargs = window.to_torch_schedule(first_step=0)
    schedule = torch_profiler.schedule(**kwargs)
    recorded = {
        i for i in range(60)
        if schedule(i) in (torch_profiler.ProfilerAction.RECORD, torch_profiler.ProfilerAction.RECORD_AND_SAVE)
    }
    assert recorded == set(window.steps)


def test_torch_schedule_refusals() -> None:
    with pytest.raises(ValueError, match="different lengths"):
        StepWindow.parse([1, 2, 5]).to_torch_schedule()
    with pytest.raises(ValueError, match="uneven"):
        StepWindow.parse([1, 4, 9]).to_torch_schedule()
    with pytest.raises(ConfigError, match="unbounded"):
        StepWindow.from_torch_schedule(wait=1, warmup=1, active=1, repeat=0)
