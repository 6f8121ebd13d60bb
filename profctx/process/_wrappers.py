"""The wrapt proxy types ``@profiled`` returns; imported by the first ``@profiled``, not by ``import profctx``.

wrapt 2's package ``__init__`` imports every submodule (``asyncio``, ``ssl`` and
``importlib.metadata`` among them, about 40 ms): keeping it here lets ``import profctx``
stay light for programs that only mark steps and roles.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import wrapt


class ProfiledFunction(wrapt.FunctionWrapper):  # type: ignore[misc,type-arg]
    """The wrapper ``@profiled`` returns; pickled (by reference or by ``pickle``) as "decorate this function again".

    ``_self_profctx_rebuild(fn, role)`` is what unpickling calls. cloudpickle's by-value copy
    (a class made remote with ``@ray.remote``, or defined in ``__main__``) reads the function's
    attributes instead; see ``_decorate._by_value``.
    """

    _self_profctx_role: str | None
    _self_profctx_rebuild: Callable[[Any, str | None], Any]
    #: What ``_decorate.is_proxy`` reads on the type.
    _profctx_proxy: ClassVar[bool] = True

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return self._self_profctx_rebuild, (self.__wrapped__, self._self_profctx_role)

    def __reduce__(self) -> tuple[Any, ...]:
        return self.__reduce_ex__(2)


class ProfiledBoundFunction(wrapt.BoundFunctionWrapper):  # type: ignore[misc,type-arg]
    """A :class:`ProfiledFunction` bound by attribute access; pickled as that access done again.

    Ray's actor machinery keeps such bound wrappers in closures of the class it pickles.
    """

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return _rebind, (self._self_parent, self._self_instance, self._self_owner)

    def __reduce__(self) -> tuple[Any, ...]:
        return self.__reduce_ex__(2)

    # Accessed on the class (``Cls.method``: no instance), this wraps a plain function and
    # cloudpickle copies it by value like one: show the parent's trampoline (``_decorate._by_value``).
    __code__ = property(lambda self: self._self_parent.__code__)
    __globals__ = property(lambda self: self._self_parent.__globals__)
    __closure__ = property(lambda self: self._self_parent.__closure__)
    __defaults__ = property(lambda self: self._self_parent.__defaults__)
    __kwdefaults__ = property(lambda self: self._self_parent.__kwdefaults__)


ProfiledFunction.__bound_function_wrapper__ = ProfiledBoundFunction  # type: ignore[misc]


def _rebind(parent: ProfiledFunction, instance: Any, owner: Any) -> Any:
    """Unpickle a :class:`ProfiledBoundFunction`."""
    return parent.__get__(instance, owner)


def method_class(fn: Any, switch: list[bool], get: Any, extra: dict[str, Any]) -> type[ProfiledFunction]:
    """Return a :class:`ProfiledFunction` subclass whose ``__get__`` reads ``switch`` from its closure.

    ``extra``: more class attributes (the by-value properties of ``_decorate._by_value``).

    ``obj.method`` runs ``__get__`` on every lookup; reading the switch and the plain getter
    from the closure instead of the proxy's attributes (about 80 ns each through wrapt's
    attribute lookup) keeps the off path of ``obj.method()`` within a few bare calls.
    """
    base_get = wrapt.FunctionWrapper.__get__

    def __get__(self: ProfiledFunction, instance: Any, owner: Any = None) -> Any:  # noqa: N807
        # Off: hand out the plain bound method (wrapt would build a bound wrapper per lookup).
        if instance is not None and not switch:
            return get(fn, instance, owner)
        return base_get(self, instance, owner)

    return type("ProfiledFunction", (ProfiledFunction,), {"__get__": __get__, "__slots__": (), **extra})
