"""Hypothesis strategies for profctx values: windows, step sequences, role trees, rank lists.

Use them to property-test your own step logic::

    from hypothesis import given
    from profctx.testing import strategies as pst

    @given(pst.windows(), pst.step_sequences())
    def test_my_loop(window, steps): ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from .._window import StepWindow

__all__ = ["RoleTree", "rank_lists", "role_names", "role_trees", "step_sequences", "window_texts", "windows"]


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


def step_sequences(max_step: int = 60, max_size: int = 25) -> st.SearchStrategy[list[int]]:
    """Step sequences a training loop could run: ascending, possibly with gaps (resumes, skips)."""
    return st.lists(st.integers(0, max_step), max_size=max_size, unique=True).map(sorted)


def role_names() -> st.SearchStrategy[str]:
    """Role names like ``rollout`` or ``actor_update``."""
    return st.sampled_from(["rollout", "actor_update", "ref_compute_log_prob", "critic_update", "reward", "gen"])


@dataclass(frozen=True)
class RoleTree:
    """A role block and the blocks nested inside it, in order."""

    role: str
    children: tuple[RoleTree, ...] = ()

    def paths(self, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
        """Return the role path of this block and of every nested block, depth first."""
        here = (*prefix, self.role)
        out = [here]
        for child in self.children:
            out.extend(child.paths(here))
        return out


def role_trees(max_depth: int = 3, max_children: int = 3) -> st.SearchStrategy[tuple[RoleTree, ...]]:
    """Sequences of nested role blocks, as one step of a loop would enter them."""
    leaf = st.builds(RoleTree, role_names())

    def extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[RoleTree]:
        return st.builds(RoleTree, role_names(), st.lists(children, max_size=max_children).map(tuple))

    tree = st.recursive(leaf, extend, max_leaves=max_depth * max_children)
    return st.lists(tree, max_size=max_children).map(tuple)


def rank_lists(world_size: int = 8) -> st.SearchStrategy[Any]:
    """Values for ``ranks``: ``"all"`` or a non-empty list of ranks below ``world_size``."""
    return st.one_of(
        st.just("all"),
        st.lists(st.integers(0, world_size - 1), min_size=1, max_size=world_size, unique=True),
    )
