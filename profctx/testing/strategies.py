"""Hypothesis strategies for profctx values: windows, step sequences, role trees, rank lists.

Use them to property-test your own step logic::

    from hypothesis import given
    from profctx.testing import strategies as pst

    @given(pst.windows(), pst.step_sequences(repeats=True), pst.role_trees(names=["gen", "train"]))
    def test_my_loop(window, steps, blocks): ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from ..core._oracle import RoleBlock
from ..core._window import StepWindow

__all__ = [
    "DEFAULT_ROLES",
    "RoleBlock",
    "RoleTree",
    "rank_lists",
    "role_names",
    "role_trees",
    "step_sequences",
    "window_texts",
    "windows",
]


def windows(max_step: int = 60, max_size: int = 12) -> st.SearchStrategy[StepWindow]:
    """Non-empty windows of steps in ``[0, max_step]``, built from every accepted form."""
    lists = st.lists(st.integers(0, max_step), min_size=1, max_size=max_size).map(StepWindow.parse)
    ranges = st.builds(
        lambda start, length, stride: StepWindow.parse(range(start, start + length * stride, stride)),
        st.integers(0, max_step // 2),
        st.integers(1, max_size),
        st.integers(1, 4),
    )
    return st.one_of(lists, ranges, window_texts(max_step).map(StepWindow.parse))


def window_texts(max_step: int = 60) -> st.SearchStrategy[str]:
    """Slice strings ``"start:stop[:stride]"`` that :meth:`StepWindow.parse` accepts."""
    return st.builds(
        lambda start, length, stride: f"{start}:{start + length}" + (f":{stride}" if stride > 1 else ""),
        st.integers(0, max_step),
        st.integers(1, 20),
        st.integers(1, 5),
    )


def step_sequences(max_step: int = 60, max_size: int = 25, *, repeats: bool = False) -> st.SearchStrategy[list[int]]:
    """Step sequences a training loop could run, of at most ``max_size`` steps in ``[0, max_step]``.

    Default: ascending with gaps (a loop that skips steps). ``repeats=True`` also draws what a
    real loop does after a failure: a retried step (the same step twice in a row) and a resume
    from an older checkpoint (the sequence jumps back and runs steps again), besides resumes
    that skip ahead.
    """
    if not repeats:
        return st.lists(st.integers(0, max_step), max_size=max_size, unique=True).map(sorted)
    return _resumed_runs(max_step, max_size)


def _resumed_runs(max_step: int, max_size: int) -> st.SearchStrategy[list[int]]:
    """Segments of consecutive steps, each starting anywhere (skip ahead or resume behind), with retries."""
    # One segment: a start and, per step, how often it runs (mostly once, sometimes retried).
    segment = st.tuples(st.integers(0, max_step), st.lists(st.sampled_from([1, 1, 1, 2, 3]), min_size=1, max_size=8))

    def flatten(segments: list[tuple[int, list[int]]]) -> list[int]:
        out: list[int] = []
        for start, times in segments:
            for step, count in zip(range(start, max_step + 1), times, strict=False):  # clipped at max_step
                out.extend([step] * count)
        return out[:max_size]

    return st.lists(segment, max_size=4).map(flatten)


#: The role names :func:`role_names` draws when the caller gives none.
DEFAULT_ROLES: tuple[str, ...] = ("rollout", "actor_update", "ref_compute_log_prob", "critic_update", "reward", "gen")


def role_names(names: Sequence[str] | None = None) -> st.SearchStrategy[str]:
    """Role names drawn from ``names`` (your own vocabulary; default :data:`DEFAULT_ROLES`)."""
    vocabulary = tuple(names) if names is not None else DEFAULT_ROLES
    if not vocabulary or not all(isinstance(n, str) and n.strip("/") and "/" not in n for n in vocabulary):
        raise ValueError(f"role_names: names must be non-empty role names without '/', got {names!r}")
    return st.sampled_from(vocabulary)


#: A role block and its nested blocks: the same class :func:`profctx.testing.expected_captures`
#: and :func:`profctx.testing.replay` take (``RoleTree`` is kept as its older name).
RoleTree = RoleBlock


def role_trees(
    max_depth: int = 3, max_children: int = 3, *, names: Sequence[str] | None = None
) -> st.SearchStrategy[tuple[RoleBlock, ...]]:
    """Sequences of nested role blocks, as one step of a loop would enter them.

    ``names``: the role names to draw from (your trainer's roles, e.g. ``["gen", "train"]``);
    the result feeds :func:`profctx.testing.expected_captures` and :func:`profctx.testing.replay`.
    """
    name = role_names(names)
    leaf = st.builds(RoleBlock, name)

    def extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[RoleBlock]:
        return st.builds(RoleBlock, name, st.lists(children, max_size=max_children).map(tuple))

    tree = st.recursive(leaf, extend, max_leaves=max_depth * max_children)
    return st.lists(tree, max_size=max_children).map(tuple)


def rank_lists(world_size: int = 8) -> st.SearchStrategy[Any]:
    """Values for ``ranks``: ``"all"`` or a non-empty list of ranks below ``world_size``."""
    return st.one_of(
        st.just("all"),
        st.lists(st.integers(0, world_size - 1), min_size=1, max_size=world_size, unique=True),
    )
