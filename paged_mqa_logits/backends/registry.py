"""The backend registry: name -> backend object, loaded on first use.

Modules are imported lazily so that a missing optional package (flydsl; Triton, checked when a
Triton backend is first loaded) or a broken toolchain only disables that backend, and the
dispatch goes on down the arch's fallback chain (``dispatch.arch_fallback_chain``, which ends in
``torch`` everywhere). The dispatcher, the op and the tooling take their backends from
here (the dispatcher through an injectable :class:`Registry`, tests register stand-ins).
"""

from __future__ import annotations

import importlib

from ..triton_internals import cache_overlay as overlay
from ..triton_internals import compiler, interpreter
from ..triton_internals.version import TritonMissing, require_triton
from ..problem import Problem, Target, resolve_target
from .base import Backend

#: backends whose ``launch`` goes through Triton ``JITFunction``s: the precompiled-kernel overlay
#: is activated before the first of them loads, so their first compile finds it
TRITON_BACKENDS = ("triton", "gluon")

# name -> "module:attribute"
_REGISTRY: dict[str, str] = {
    "torch": "paged_mqa_logits.backends.torch_ref:BACKEND",
    "triton": "paged_mqa_logits.backends.triton_portable:BACKEND",
    "gluon": "paged_mqa_logits.backends.gluon:BACKEND",
    "flydsl": "paged_mqa_logits.backends.flydsl:BACKEND",
}
#: the package's backends, the one list of their names (tables may name only these; a backend
#: :func:`register` adds at run time is not one of them)
BACKEND_NAMES = tuple(_REGISTRY)

_LOADED: dict[str, Backend] = {}
_LOAD_ERRORS: dict[str, str] = {}
_CHECKS: dict[tuple, str | None] = {}


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
    try:
        if name in TRITON_BACKENDS:
            require_triton()  # no (or too old a) Triton: this backend is unavailable, the chain goes on
            overlay.activate()  # precompiled kernels are found from the backend's first compile on
            interpreter.serialise_compiles()  # CPU calls and GPU compiles on other threads wait for each other
            compiler.order_independent_cache_keys()  # before any kernel is keyed: precompiled keys match
        backend = getattr(importlib.import_module(module_name), attr)
    except TritonMissing as exc:  # the package's own message says what to install
        _LOAD_ERRORS[name] = str(exc)
        return None
    except Exception as exc:  # an optional backend must never break the package
        _LOAD_ERRORS[name] = f"{type(exc).__name__}: {exc}"
        return None
    _LOADED[name] = backend
    return backend


def load_error(name: str) -> str | None:
    return _LOAD_ERRORS.get(name)


def why_not(name: str, problem: Problem, target: Target | None = None) -> str | None:
    """``None`` if backend ``name`` can serve ``problem`` on ``target``, else the reason it cannot:
    the backend's ``unsupported(problem)``, then, unless ``target`` is hypothetical (a call
    described, not made), its ``unavailable(target)``. ``target`` defaults to the problem's chip
    with the tensors on it (:meth:`Target.present`), as a call validated here has."""
    backend = get(name)
    if backend is None:
        return f"backend {name!r} is unavailable ({load_error(name)})"
    reason = backend.unsupported(problem)
    target = resolve_target(problem, target)
    if reason is not None or target.hypothetical:
        return reason
    unavailable = getattr(backend, "unavailable", None)  # out-of-tree backends written before it
    return None if unavailable is None else unavailable(target)


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


class Registry:
    """The registry as an object, for code that gets its backends injected (the dispatcher):
    the module functions by default, any object with ``get`` and ``why_not(name, problem,
    target)`` in tests."""

    get = staticmethod(get)
    why_not = staticmethod(why_not)
    names = staticmethod(names)
    check_config = staticmethod(check_config)


DEFAULT = Registry()
