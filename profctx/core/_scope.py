"""The ambient scope: global step, role path and tags, held in one ContextVar."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any, final


@final
class Scope:
    """Where the code is: the global step, the role path and free-form tags.

    Immutable and hashable. ``roles`` is the path of nested roles, outermost first;
    ``role`` is its innermost entry and ``path`` its ``/``-joined rendering.
    """

    __slots__ = ("_kids", "_quiet", "_tags", "roles", "step")

    step: int | None
    roles: tuple[str, ...]
    _tags: tuple[tuple[str, Any], ...]
    #: Role-only children kept for reuse (:func:`keep`); not part of the value.
    _kids: dict[str, Scope] | None
    #: On a kept child: the runtime's policies under which its role path draws nothing in an
    #: in-window step outside any capture (:func:`mark_quiet`); not part of the value.
    _quiet: object

    def __init__(
        self,
        step: int | None = None,
        roles: tuple[str, ...] = (),
        tags: Mapping[str, Any] | None = None,
    ) -> None:
        _init(self, step, tuple(roles), tuple(sorted(tags.items())) if tags else ())

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Scope is immutable: cannot set {name!r}; use profile_step() for a new scope")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Scope is immutable: cannot delete {name!r}")

    @property
    def role(self) -> str | None:
        """The innermost role, or ``None`` outside any role."""
        return self.roles[-1] if self.roles else None

    @property
    def path(self) -> str:
        """The role path joined with ``/`` (empty outside any role)."""
        return "/".join(self.roles)

    @property
    def tags(self) -> Mapping[str, Any]:
        """The tags, read-only."""
        return MappingProxyType(dict(self._tags))

    def child(self, step: int | None, role: str | None, tags: Mapping[str, Any]) -> Scope:
        """Return the scope of a nested block that sets ``step``, adds ``role`` and merges ``tags``.

        Raises ``ValueError`` for an empty role (``""``, ``"/"``).
        """
        new = Unfrozen()
        new.step = self.step if step is None else step
        new.roles = self.roles if role is None else self.roles + role_parts(role)
        new._tags = merge_tags(self._tags, tags) if tags else self._tags
        new._kids = new._quiet = None
        new.__class__ = Scope  # type: ignore[assignment]
        return new  # type: ignore[return-value]

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle, copy and deepcopy: through the constructor (the slots refuse assignment).
        return Scope, (self.step, self.roles, dict(self._tags))

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-safe dict (``step``, ``roles``, ``tags``)."""
        return {"step": self.step, "roles": list(self.roles), "tags": dict(self._tags)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scope:
        """Return the scope a :meth:`to_dict` result describes."""
        step = data.get("step")
        return cls(
            None if step is None else int(step),
            tuple(str(r) for r in data.get("roles", ())),
            dict(data.get("tags") or {}),
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Scope)
            and self.step == other.step
            and self.roles == other.roles
            and self._tags == other._tags
        )

    def __hash__(self) -> int:
        return hash((self.step, self.roles, _freeze(self._tags)))

    def __repr__(self) -> str:
        return f"Scope(step={self.step!r}, roles={self.roles!r}, tags={dict(self._tags)!r})"


class Unfrozen:
    """:class:`Scope`'s layout without its guard: a block fills one in, then makes it a ``Scope``.

    Every block entry builds a scope. Filling a guarded ``Scope``'s three slots through their
    descriptors (its ``__setattr__`` refuses plain assignment) costs about three times as much
    as plain assignment here followed by one ``__class__`` change (the two classes have the
    same slots, so CPython allows it; ``tests/test_scope.py`` checks what comes out). Keep the
    two ``__slots__`` alike, and set ``_kids`` and ``_quiet`` (``None``) too.
    """

    __slots__ = ("_kids", "_quiet", "_tags", "roles", "step")

    step: int | None
    roles: tuple[str, ...]
    _tags: tuple[tuple[str, Any], ...]
    _kids: dict[str, Scope] | None
    _quiet: object


def merge_tags(base: tuple[tuple[str, Any], ...], tags: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Return ``base`` (a scope's sorted tag pairs) updated with ``tags``, sorted."""
    return tuple(sorted({**dict(base), **tags}.items()))


# The slots' own setters, for the public constructor (a ``Scope`` refuses plain assignment).
_SET_STEP = Scope.__dict__["step"].__set__
_SET_ROLES = Scope.__dict__["roles"].__set__
_SET_TAGS = Scope.__dict__["_tags"].__set__
_SET_KIDS = Scope.__dict__["_kids"].__set__
_SET_QUIET = Scope.__dict__["_quiet"].__set__


def _init(scope: Scope, step: int | None, roles: tuple[str, ...], tags: tuple[tuple[str, Any], ...]) -> None:
    _SET_STEP(scope, step)
    _SET_ROLES(scope, roles)
    _SET_TAGS(scope, tags)
    _SET_KIDS(scope, None)
    _SET_QUIET(scope, None)


#: Role-only children a scope keeps (:func:`keep`); past this many it forgets them all and starts over.
KIDS_MAX = 64


def keep(parent: Scope, role: str, child: Scope) -> None:
    """Remember ``child``, ``parent.child(None, role, {})``, for the next block of ``role`` in ``parent``.

    Blocks repeat: the role blocks of a step, the ``@profiled`` calls of a loop. Handing back the
    same immutable child costs a dict lookup where building one costs several stores. Bounded
    per parent (:data:`KIDS_MAX`), and it goes with the parent; :data:`ROOT`'s, which would
    outlive the configuration, are dropped by ``profctx.reset()`` (:func:`forget`).
    Thread-safe: a dict's item access is atomic, and a lost entry costs one rebuild.
    """
    kids = getattr(parent, "_kids", None)  # unset on a scope filled in without it
    if kids is None:
        _SET_KIDS(parent, {role: child})
        return
    if len(kids) >= KIDS_MAX:
        kids.clear()
    kids[role] = child


def forget(scope: Scope) -> None:
    """Drop the children ``scope`` keeps (``profctx.reset()`` on :data:`ROOT`: it leaves no state behind)."""
    _SET_KIDS(scope, None)


def mark_quiet(scope: Scope, policies: object) -> None:
    """Note on ``scope`` (a kept child) that its role path draws nothing under ``policies`` (see ``Scope._quiet``).

    A role block then tests ``scope._quiet is runtime._policies``: one identity test where a
    dict lookup hashed the role path (about 100 ns a block, measured with ``bench_blocks.py``).
    """
    _SET_QUIET(scope, policies)


def _freeze(value: Any) -> Any:
    """Return a hashable stand-in for a tag value (lists, dicts and sets as tuples and frozensets)."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((repr(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        return frozenset(_freeze(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def split_role(role: str) -> tuple[str, ...]:
    """Split ``"a/b"`` into ``("a", "b")``; refuse an empty role with ``ValueError``."""
    parts = tuple(p for p in role.split("/") if p)
    if not parts:
        raise ValueError(f"role: {role!r} is not valid; a role is a non-empty name such as 'rollout'")
    return parts


#: :func:`split_role` memoised (a pure function; programs use a handful of role names).
role_parts = functools.lru_cache(maxsize=1024)(split_role)


ROOT = Scope()
SCOPE: ContextVar[Scope] = ContextVar("profctx.scope", default=ROOT)


def under(scope: Scope, base: Scope) -> Scope:
    """Return ``scope`` placed inside ``base``: ``base``'s step, ``base``'s roles then ``scope``'s, both tags merged.

    What a block with no step of its own sees inside a step held for the whole process
    (``process._block.ambient``); ``scope``'s own step, if any, is ignored.
    """
    new = Unfrozen()
    new.step = base.step
    new.roles = base.roles + scope.roles if base.roles else scope.roles
    new._tags = merge_tags(base._tags, dict(scope._tags))
    new._kids = new._quiet = None
    new.__class__ = Scope  # type: ignore[assignment]
    return new  # type: ignore[return-value]
