"""StepWindow: accepted forms, refusals, runs, converters."""

from __future__ import annotations

import fractions
import itertools
import pickle
import tracemalloc

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


# -- the compact form: a window answers as the set of its steps, without listing them ----------------------------------

def _schedule_steps(wait: int, warmup: int, active: int, repeat: int, skip_first: int, first_step: int) -> set[int]:
    """The steps torch's schedule records, walked index by index (the reference for the repeat form)."""
    period, recorded = wait + warmup + active, set()
    for index in range(skip_first + repeat * period):
        into = index - skip_first
        if into >= 0 and into % period >= wait + warmup:
            recorded.add(first_step + index)
    return recorded


_SLICES = st.builds(lambda start, length, stride: (start, start + length, stride),
                    st.integers(0, 300), st.integers(1, 3000), st.integers(1, 40))
_SCHEDULES = st.fixed_dictionaries({
    "wait": st.integers(0, 6), "warmup": st.integers(0, 3), "active": st.integers(1, 6), "repeat": st.integers(1, 40),
    "skip_first": st.integers(0, 6), "first_step": st.integers(0, 6),
})
#: A union of progressions (overlapping or not), as a list: the greedy split of arbitrary sets.
_UNIONS = st.lists(_SLICES, min_size=1, max_size=5).map(
    lambda spans: sorted({s for start, stop, stride in spans
                          for s in range(start, min(stop, start + 60 * stride), stride)}))


@st.composite
def _specs(draw: st.DrawFn) -> tuple[StepWindow, set[int]]:
    form = draw(st.sampled_from(["slice", "range", "reversed", "union", "text"]))
    if form == "union":
        steps = draw(_UNIONS)
        return StepWindow.parse(steps), set(steps)
    start, stop, stride = draw(_SLICES)
    expected = set(range(start, stop, stride))
    if form == "slice":
        return StepWindow.parse(f"{start}:{stop}" if stride == 1 else f"{start}:{stop}:{stride}"), expected
    if form == "range":
        return StepWindow.parse(range(start, stop, stride)), expected
    if form == "reversed":
        return StepWindow.parse(range(stop - 1, start - 1, -stride)), set(range(stop - 1, start - 1, -stride))
    return StepWindow.parse(",".join(map(str, sorted(expected)[:50]))), set(sorted(expected)[:50])


@given(_specs(), st.lists(st.integers(-5, 4000), max_size=30))
def test_the_compact_window_answers_as_its_expanded_set(spec: tuple[StepWindow, set[int]], probes: list[int]) -> None:
    _answers_as(*spec, probes)


@given(_SCHEDULES, st.lists(st.integers(-5, 400), max_size=30))
def test_the_compact_repeat_form_answers_as_torch_schedule_records(
    schedule: dict[str, int], probes: list[int]
) -> None:
    _answers_as(StepWindow.from_torch_schedule(**schedule), _schedule_steps(**schedule), probes)


def _answers_as(window: StepWindow, expected: set[int], probes: list[int]) -> None:
    ordered = sorted(expected)
    edges = [ordered[0] - 1, ordered[0], ordered[-1], ordered[-1] + 1]
    for step in [*probes, *edges, *ordered[:: max(1, len(ordered) // 40)]]:
        assert window.contains(step) == (step in expected), step
        assert (step in window) == (step in expected), step
    assert window.steps == tuple(ordered) and list(window) == ordered
    assert len(window) == len(expected) and bool(window)
    assert (window.first, window.last) == (ordered[0], ordered[-1])
    # Equal windows are equal however they were built, hash alike, and survive text and pickle.
    listed = StepWindow(ordered)
    assert listed == window and hash(listed) == hash(window)
    assert StepWindow.parse(window.describe()) == window
    assert pickle.loads(pickle.dumps(window)) == window
    runs: list[list[int]] = []
    for step in ordered:
        if runs and runs[-1][-1] == step - 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    assert [list(run) for run in window.runs()] == runs
    for step in {ordered[0], ordered[-1], ordered[len(ordered) // 2]}:
        assert list(window.run_of(step) or ()) == next(run for run in runs if step in run)


@pytest.mark.parametrize(
    "build",
    [lambda: StepWindow.parse("0:100000"), lambda: StepWindow.parse("1:100000:3"),
     lambda: StepWindow.parse(range(99_999, -1, -1)),
     lambda: StepWindow.from_torch_schedule(wait=4, warmup=1, active=1, repeat=100_000)],
    ids=["slice", "strided-slice", "descending-range", "schedule"],
)
def test_a_long_progression_is_held_and_asked_without_listing_its_steps(build: object) -> None:
    tracemalloc.start()
    try:
        window = build()  # type: ignore[operator]
        answers = (window.first, window.last, len(window), window.contains(50_000), 7 in window, bool(window),
                   window.describe(), hash(window), len(pickle.dumps(window)))
        used = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert answers[2] == len(set(window))
    assert used < 64 * 1024, used  # listing 100,000 steps takes megabytes


def test_a_step_of_another_integral_type_counts_by_value() -> None:
    window = StepWindow.parse("0:10")
    assert True in window and 3.0 in window and fractions.Fraction(6, 2) in window
    assert 3.5 not in window and "3" not in window and None not in window and 10**40 not in window
    assert StepWindow.parse([1, 5]).contains(True) and not StepWindow.parse([2, 5]).contains(True)


def test_a_descending_range_names_its_first_negative_step_as_reading_it_would() -> None:
    with pytest.raises(ConfigError, match=r"steps: -1 .*integers >= 0"):
        StepWindow(range(5, -3, -1))
    with pytest.raises(ConfigError, match=f"at most {MAX_STEPS} steps"):
        StepWindow(range(MAX_STEPS + 5, -3, -1))  # the limit is passed before the first negative step


def test_configure_with_a_long_window_lists_no_step(tmp_path: object) -> None:
    # configure() kept the window's steps as a set for the blocks' membership test: 6 ms and megabytes for
    # "1:100000". A long window now answers that test itself; the blocks still capture the steps it names.
    import profctx
    from profctx.records._manifest import read

    profctx.configure(steps="1:100000", tool="noop", save_path=str(tmp_path), exit_hooks=False, timeline=False)
    profctx.reset()  # the first configure() of a process also sets up what any later one reuses
    tracemalloc.start()
    try:
        profctx.configure(steps="1:100000", tool="noop", save_path=str(tmp_path), exit_hooks=False,
                          timeline=False)
        used = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    for step in (0, 50_000, 100_000):
        with profctx.profile_step(step):
            pass
    assert profctx.flush(10)
    assert sorted(r["step"] for r in read(tmp_path) if r["status"] == "ok") == [50_000]
    assert used < 1024 * 1024, used  # a set of 100,000 steps alone is about 4 MB
