"""Backend registry and the small interface every backend implements.

A backend answers three questions and does one thing:

* ``unsupported(problem) -> str | None``: why it cannot serve this problem (``None`` = it can).
  Must be cheap, host-only, and must not import optional heavy packages at module import time.
* ``candidates(problem) -> list[dict]``: the knob sets the tuner may time for this problem.
* ``default_config(problem) -> dict``: knobs used when the table names the backend without
  knobs, or when dispatch falls back to this backend.
* ``check_config(config, problem=None) -> str | None``: ``None`` when every knob of ``config``
  is one this backend reads with a value it accepts (for ``problem``, else for any problem it
  serves), otherwise a message naming the knob and listing the allowed values. Host-only. The
  tables check every row with it when they load; ``launch`` is only given configs it accepts.
* ``launch(args, config)``: write the logits of ``args`` (a :class:`LaunchArgs`) into
  ``args.out`` following the output contract, with no host-device synchronisation.

Knob dictionaries use the CSV column names (``ChunkK``, ``WavePerEU``, ``SplitKV``, plus any
backend-specific ones such as ``num_warps``). ``None`` values mean "backend default". A backend
declares its knobs' allowed values as a ``KNOB_SPACE`` (knob -> tuple of values or ``range``),
checked by :func:`check_knob_space`.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from ..problem import LaunchArgs, Problem


class Backend(Protocol):
    name: str
    #: knob names this backend reads, in CSV column spelling
    knobs: tuple[str, ...]

    def unsupported(self, problem: Problem) -> str | None: ...

    def candidates(self, problem: Problem) -> list[dict]: ...

    def default_config(self, problem: Problem) -> dict: ...

    def check_config(self, config: dict, problem: Problem | None = None) -> str | None: ...

    def launch(self, args: LaunchArgs, config: dict) -> None: ...


# name -> "module:attribute". Modules are imported lazily so that a missing optional package
# (flydsl) or a broken toolchain only disables that backend.
_REGISTRY: dict[str, str] = {
    "torch": "paged_mqa_logits.backends.torch_ref:BACKEND",
    "triton": "paged_mqa_logits.backends.triton_portable:BACKEND",
    "gluon": "paged_mqa_logits.backends.gluon:BACKEND",
    "flydsl": "paged_mqa_logits.backends.flydsl_cdna:BACKEND",
}

_LOADED: dict[str, Backend] = {}
_LOAD_ERRORS: dict[str, str] = {}


def register(name: str, backend: Backend, spec: str | None = None) -> None:
    """Add (or replace) a backend object under ``name``: out-of-tree or test backends.
    ``spec`` (``module:attr``) lets other processes import the same object."""
    _REGISTRY[name] = spec or f"{type(backend).__module__}:{type(backend).__name__}"
    _LOADED[name] = backend
    _LOAD_ERRORS.pop(name, None)
    _CHECKS.clear()


def names() -> list[str]:
    return list(_REGISTRY)


def get(name: str) -> Backend | None:
    """The backend object, or ``None`` if its module cannot be imported (see :func:`load_error`)."""
    if name in _LOADED:
        return _LOADED[name]
    if name in _LOAD_ERRORS:
        return None
    if name not in _REGISTRY:
        raise KeyError(f"unknown backend {name!r}; known: {', '.join(_REGISTRY)}")
    module_name, attr = _REGISTRY[name].split(":")
    if name in ("triton", "gluon"):
        from .. import kernel_cache

        kernel_cache.activate()  # precompiled kernels are found from the backend's first compile on
    try:
        backend = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # an optional backend must never break the package
        _LOAD_ERRORS[name] = f"{type(exc).__name__}: {exc}"
        return None
    _LOADED[name] = backend
    return backend


def load_error(name: str) -> str | None:
    return _LOAD_ERRORS.get(name)


def why_not(name: str, problem: Problem) -> str | None:
    """``None`` if backend ``name`` can serve ``problem``, else the reason it cannot."""
    backend = get(name)
    if backend is None:
        return f"backend {name!r} is unavailable ({load_error(name)})"
    return backend.unsupported(problem)


#: SplitKV's bound in every backend: more splits than this are never useful (a split is at least
#: one chunk of a 128k context) and make grids that take minutes to drain
MAX_SPLIT_KV = 1024


def describe_allowed(allowed) -> str:
    if isinstance(allowed, range):
        return f"an integer in {allowed.start}..{allowed.stop - 1}"
    return "one of " + ", ".join(str(v) for v in allowed)


def value_allowed(value, allowed) -> bool:
    """``value`` is in ``allowed`` *with the same type*: ``64.0`` or ``True`` is not the int ``64``/``1``."""
    if isinstance(allowed, range):
        return type(value) is int and value in allowed
    return any(type(value) is type(a) and value == a for a in allowed)


def check_knob_space(owner: str, config: dict, space: dict, extra=()) -> str | None:
    """``None`` if every set knob of ``config`` is in ``space`` (or ``extra``, names checked
    elsewhere) with an allowed value; else a message naming the knob and the allowed values."""
    for knob, value in config.items():
        if value is None or knob in extra:
            continue
        if knob not in space:
            known = ", ".join(sorted(set(space) | set(extra))) or "none"
            return f"{owner} has no knob {knob!r} (its knobs: {known})"
        if not value_allowed(value, space[knob]):
            return f"{owner} knob {knob}={value!r}: expected {describe_allowed(space[knob])}"
    return None


_CHECKS: dict[tuple, str | None] = {}


def check_config(name: str, config: dict, problem: Problem | None = None) -> str | None:
    """Backend ``name``'s verdict on ``config`` (memoised: tables and forced configs repeat)."""
    try:  # the common case: the same small dict of ints and strings on every call
        key = (name, tuple(config.items()), problem)
        hash(key)
    except TypeError:
        key = (name, tuple((k, repr(v)) for k, v in config.items()), problem)
    if key not in _CHECKS:
        backend = get(name)
        if backend is None:
            return f"backend {name!r} is unavailable ({load_error(name)})"
        check = getattr(backend, "check_config", None)  # out-of-tree backends written before it
        _CHECKS[key] = None if check is None else check(config, problem)
    return _CHECKS[key]
