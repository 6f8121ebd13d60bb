"""Captures nobody planned: the request a live run accepts, and the pure decisions about it.

A request (written by ``profctx trigger``, or made by the run itself after an anomalous step)
names a count and either an absolute first step or none. Without one it is relative: the run's
deciding process (the only process, the Ray driver, or rank 0 of a job without Ray) names the
first step from its own progress, the step after the one it enters next, and tells the other
ranks through an agreed request at a step boundary they cross (nothing compares the CLI's clock
with the run's). Every process that accepts a request captures exactly the steps
``[first, first + count)``, or none of them. The rules here take no clock, read no file
and hold no state, so Hypothesis tests them (``tests/test_ondemand.py``); the process side
(``profctx.process._ondemand``) reads the files and the clock and executes them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, final

from ..util._errors import ConfigError
from ._vocab import MODES, Mode

#: Version of the request file format.
REQUEST_VERSION: Final = 1
#: Largest request file read (a request is a few hundred bytes).
MAX_REQUEST_BYTES: Final = 16 * 1024
#: Most steps one request may ask for (a request that asks for more is refused by the CLI and the run).
MAX_REQUEST_STEPS: Final = 100
#: Default cap of on-demand captures (accepted requests) per process and configuration.
DEFAULT_MAX_CAPTURES: Final = 10

Origin = Literal["trigger", "anomaly"]
Outcome = Literal["schedule", "passed", "cap", "known", "overlap"]
At = Literal["wait", "start", "within", "passed", "done"]


class RequestError(ValueError):
    """Raise for a request file that is not a valid request (the run ignores it, with one warning)."""


def _name(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 64 and all(
        c.isascii() and (c.isalnum() or c in "._-") for c in value)


def _count(value: object) -> bool:
    return type(value) is int and 1 <= value <= MAX_REQUEST_STEPS


@final
@dataclass(frozen=True)
class Request:
    """Capture ``count`` steps from step ``first`` on, with the config's mode and roles unless given.

    ``group``/``ranks`` select the processes that capture (``None``: the config's selection);
    ``origin`` says who asked: ``profctx trigger`` or the run itself after an anomaly, whose
    ``reason`` says why. ``user``, ``uid``, ``host``, ``pid`` and ``time`` name who asked, where
    and when (Unix seconds). Raise :class:`RequestError` for invalid values.
    """

    id: str
    first: int | None = None
    count: int = 1
    mode: Mode | None = None
    roles: tuple[str, ...] | None = None
    group: str | None = None
    ranks: tuple[int, ...] | None = None
    origin: Origin = "trigger"
    reason: str | None = None
    user: str | None = None
    uid: int | None = None
    host: str | None = None
    pid: int | None = None
    time: float | None = None
    #: The run the request is for (``None``: any run writing to the folder).
    run: str | None = None

    def __post_init__(self) -> None:
        if not _name(self.id):
            raise RequestError(f"id: {self.id!r}; letters, digits, '.', '_' or '-' (1-64 characters)")
        if self.first is not None and (type(self.first) is not int or self.first < 0):
            raise RequestError(f"first: {self.first!r}; an integer >= 0, or null (the run names it)")
        if self.run is not None and not _name(self.run):
            raise RequestError(f"run: {self.run!r}; a run id")
        if not _count(self.count):
            raise RequestError(f"count: {self.count!r}; an integer from 1 to {MAX_REQUEST_STEPS}")
        if self.mode is not None and self.mode not in MODES:
            raise RequestError(f"mode: {self.mode!r}; {', '.join(map(repr, MODES))} or null")
        if self.roles is not None and (not isinstance(self.roles, tuple) or not 0 < len(self.roles) <= 64 or not all(
                isinstance(r, str) and 0 < len(r) <= 256 and "," not in r for r in self.roles)):
            raise RequestError(f"roles: {self.roles!r}; a list of 1-64 role names or patterns")
        if self.group is not None and not _name(self.group):
            raise RequestError(f"group: {self.group!r}; a worker group name")
        if self.ranks is not None and (not isinstance(self.ranks, tuple) or not 0 < len(self.ranks) <= 4096 or not all(
                type(r) is int and r >= 0 for r in self.ranks)):
            raise RequestError(f"ranks: {self.ranks!r}; a list of 1-4096 integers >= 0")
        if self.origin not in ("trigger", "anomaly"):
            raise RequestError(f"origin: {self.origin!r}; 'trigger' or 'anomaly'")
        for key, kind, limit in (("reason", str, 512), ("user", str, 256), ("host", str, 256)):
            value = getattr(self, key)
            if value is not None and (type(value) is not kind or len(value) > limit):
                raise RequestError(f"{key}: {value!r}; text of at most {limit} characters")
        for key in ("uid", "pid"):
            value = getattr(self, key)
            if value is not None and (type(value) is not int or value < 0):
                raise RequestError(f"{key}: {value!r}; an integer >= 0")
        if self.time is not None and (type(self.time) not in (int, float) or not math.isfinite(self.time)):
            raise RequestError(f"time: {self.time!r}; Unix seconds")

    @property
    def steps(self) -> range:
        """The steps the request captures (none while it is relative: no first step named yet)."""
        return range(0) if self.first is None else range(self.first, self.first + self.count)

    def at(self, first: int) -> Request:
        """Return this request with its first step named."""
        return Request(**{**{name: getattr(self, name) for name in self.__dataclass_fields__}, "first": first})

    def selects(self, group: str | None, rank: int, configured: bool) -> bool:
        """Whether the process of ``rank`` in ``group`` captures; ``configured``: the config's own answer.

        ``group`` given: members of that worker group only (of ``ranks``, when given). ``ranks``
        alone: those ranks, in any group or none. Neither: the config's selection.
        """
        if self.group is not None:
            return group == self.group and (self.ranks is None or rank in self.ranks)
        if self.ranks is not None:
            return rank in self.ranks
        return configured

    def describe(self) -> str:
        """Return one line for listings: ``on demand: request 3f2a… by alice, steps 120-121``."""
        if self.first is None:
            steps = f"the {self.count} step(s) after the run's next step"
        else:
            steps = str(self.first) if self.count == 1 else f"{self.first}-{self.first + self.count - 1}"
        if self.origin == "anomaly":
            return f"auto capture: {self.reason or 'an anomalous step'}"
        who = f" by {self.user}" if self.user else (f" by uid {self.uid}" if self.uid is not None else "")
        return f"on demand: request {self.id}{who}, steps {steps}"

    def to_dict(self) -> dict[str, Any]:
        """Return the request as the JSON object its file holds (:func:`parse` reads it back)."""
        return {
            "profctx_request": REQUEST_VERSION, "id": self.id, "first": self.first, "count": self.count,
            "mode": self.mode, "roles": None if self.roles is None else list(self.roles), "group": self.group,
            "ranks": None if self.ranks is None else list(self.ranks), "origin": self.origin, "reason": self.reason,
            "user": self.user, "uid": self.uid, "host": self.host, "pid": self.pid, "time": self.time,
            "run": self.run,
        }


_KEYS: Final = frozenset(Request.__dataclass_fields__) | {"profctx_request"}


def parse(data: object) -> Request:
    """Return the request a parsed JSON value describes; raise :class:`RequestError` for anything else.

    Unknown keys, a missing or newer version, and values of the wrong type are refused.
    """
    if not isinstance(data, Mapping):
        raise RequestError(f"a JSON object, not {type(data).__name__}")
    if data.get("profctx_request") != REQUEST_VERSION:
        raise RequestError(f"profctx_request: {data.get('profctx_request')!r}; {REQUEST_VERSION}")
    unknown = sorted(str(k) for k in data if k not in _KEYS)
    if unknown:
        raise RequestError(f"unknown keys {unknown[:5]!r}")
    fields = {k: v for k, v in data.items() if k != "profctx_request"}
    for key in ("roles", "ranks"):
        value = fields.get(key)
        if value is not None:
            if not isinstance(value, list):
                raise RequestError(f"{key}: {value!r}; a list or null")
            fields[key] = tuple(value)
    if "id" not in fields:
        raise RequestError("the key 'id' is required")
    try:
        return Request(**fields)
    except TypeError as exc:  # a key given twice cannot happen in JSON; guards the constructor's signature
        raise RequestError(str(exc)) from None


def admit(request: Request, last_step: int | None, accepted: int, cap: int, known: bool,
          scheduled: Iterable[Request] = ()) -> Outcome:
    """Return what a process does with a request (its first step named) it has just read.

    ``known``: it accepted or refused this request's id already (a request file stays until it is
    removed); ``passed``: the process already entered the first step (it records the request as
    skipped rather than capture different steps than the others); ``overlap``: a request from
    ``profctx trigger`` whose steps overlap those of one in ``scheduled`` (still to capture) is
    refused, never merged: each request's captures stay exactly the steps it was told; ``cap``:
    ``accepted`` requests reached the ``cap``.
    """
    if known:
        return "known"
    if request.first is not None and last_step is not None and request.first <= last_step:
        return "passed"
    if request.origin == "trigger" and overlapping(request, scheduled) is not None:
        return "overlap"
    if accepted >= cap:
        return "cap"
    return "schedule"


def overlapping(request: Request, scheduled: Iterable[Request]) -> Request | None:
    """Return the first of ``scheduled`` (requests from ``profctx trigger``) whose steps overlap ``request``'s."""
    steps = request.steps
    for other in scheduled:
        if other.origin == "trigger" and other.id != request.id and other.first is not None and steps and (
                other.first < steps.stop and steps.start < other.first + other.count):
            return other
    return None


def at_step(step: int, request: Request, started: bool) -> At:
    """Return what entering ``step`` means for a scheduled request (started: its first step was entered)."""
    if request.first is None:
        return "wait"
    first, end = request.first, request.first + request.count
    if not started:
        if step < first:
            return "wait"
        return "start" if step == first else "passed"
    return "within" if first <= step < end else "done"


# -- capture on anomaly -----------------------------------------------------------------------


@final
@dataclass(frozen=True)
class AutoCapture:
    """Capture the step after one that took more than ``factor`` times the median of the last ``window`` steps.

    ``role``: watch that top-level role's time in each step instead of the step's. At most
    ``max_captures`` per process and configuration. Raise :class:`ConfigError` for bad values.
    """

    factor: float = 2.0
    window: int = 20
    max_captures: int = 3
    role: str | None = None

    def __post_init__(self) -> None:
        if type(self.factor) not in (int, float) or not 1 < self.factor < 1e6:
            raise ConfigError("auto_capture.factor", self.factor, "a number > 1 (and below 1e6): how many times the "
                              "median a step must take to count as anomalous")
        object.__setattr__(self, "factor", float(self.factor))
        if type(self.window) is not int or not 3 <= self.window <= 10_000:
            raise ConfigError("auto_capture.window", self.window, "an integer from 3 to 10000: steps in the median")
        if type(self.max_captures) is not int or not 1 <= self.max_captures <= 1000:
            raise ConfigError("auto_capture.max_captures", self.max_captures, "an integer from 1 to 1000")
        if self.role is not None and (not isinstance(self.role, str) or not self.role.strip() or "/" in self.role
                                      or len(self.role) > 256):
            raise ConfigError("auto_capture.role", self.role, "a top-level role name (no '/'), or None to watch "
                              "the step's time")

    @classmethod
    def of(cls, value: object) -> AutoCapture | None:
        """Return the setting ``value`` describes: ``None``/``False`` (off), ``True`` (defaults), a mapping."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, AutoCapture):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError("auto_capture", value, "a mapping such as {'factor': 2.0, 'window': 20, "
                              "'max_captures': 3, 'role': None}, true (those defaults) or null (off)")
        names = set(cls.__dataclass_fields__)
        for key in value:
            if key not in names:
                raise ConfigError(f"auto_capture.{key}", value[key], f"known fields: {', '.join(sorted(names))}")
        return cls(**value)

    def to_dict(self) -> dict[str, Any]:
        """Return the setting as a JSON-safe mapping (:meth:`of` reads it back)."""
        return {"factor": self.factor, "window": self.window, "max_captures": self.max_captures, "role": self.role}


def anomaly(seconds: float, history: Sequence[float], factor: float, window: int) -> float | None:
    """Return the median of ``history`` when ``seconds`` exceeds ``factor`` times it; else ``None``.

    Judged only once ``window`` times are known (``history`` holds the last ``window`` at most):
    before that, a median says little.
    """
    if len(history) < window or not math.isfinite(seconds):
        return None
    median = _median(history[-window:])
    return median if median > 0 and seconds > factor * median else None


def _median(values: Sequence[float]) -> float:
    """Return the median of ``values`` (not empty); ``statistics`` is not imported for it (it pulls ``decimal``)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def reason(step: int, seconds: float, median: float, window: int, role: str | None = None) -> str:
    """Return why a capture was taken: ``step 812 took 2.7x the median of the last 20 steps (1.23 s vs 0.45 s)``.

    The ``x`` is written as the multiplication sign.
    """
    what = f"role {role} in step {step}" if role else f"step {step}"
    return (f"{what} took {seconds / median:.1f}\u00d7 the median of the last {window} steps "
            f"({_seconds(seconds)} vs {_seconds(median)})")


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value >= 0.1 else f"{value * 1000:.1f} ms"
