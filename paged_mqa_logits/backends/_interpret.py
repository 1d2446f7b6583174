"""Run a ``@triton.jit`` kernel through Triton's interpreter without ``TRITON_INTERPRET=1``.

The interpreter only runs functions wrapped as :class:`InterpretedFunction`, and a kernel
calls its ``@triton.jit`` helpers through its module globals, where they are compiled-mode
``JITFunction`` objects; ``tl.max``/``tl.sum``/``tl.cdiv`` are such functions too.
:func:`interpreted` rebuilds the kernel over a copy of its globals in which every jitted
helper is interpreted, and swaps interpreted twins in for the jitted members of
``triton.language`` for the duration of a launch (under a lock), so CPU tensors run the very
same source the GPU compiles while the module keeps serving GPUs. Loop bounds computed from
loaded values are interpreter arrays of one element, which numpy 2 refuses to turn into ints,
so ``range``/``tl.range`` are replaced by versions that unwrap them. The interpreter internals
this leans on come from ``paged_mqa_logits._triton_compat``.
"""

from __future__ import annotations

import builtins
import contextlib
import threading
import types

import triton.language as tl

from .._triton_compat import (InterpretedFunction, JITFunction, interpreter_gpu_float_semantics,
                              interpreter_language_extras)

_CACHE: dict[int, "_InterpretedKernel"] = {}
_ENVS: dict[int, dict] = {}  # id(module globals) -> the interpreted copy of those globals


def _interpreted_env(module_globals: dict) -> dict:
    """A copy of a module's globals whose jitted functions are interpreted (memoised, so
    mutually-referencing helpers and helpers from other modules resolve without recursion)."""
    key = id(module_globals)
    if key in _ENVS:
        return _ENVS[key]
    env = dict(module_globals)
    env["range"] = _scalar_range
    _ENVS[key] = env
    for name, value in module_globals.items():
        if isinstance(value, JITFunction):
            env[name] = InterpretedFunction(_rebind(value.fn))
    return env


def _as_int(value):
    if isinstance(value, tl.constexpr):
        value = value.value
    handle = getattr(value, "handle", None)
    if handle is not None:  # the interpreter keeps scalars as 1-element arrays
        return int(handle.data.reshape(-1)[0])
    return int(value)


def _scalar_range(*bounds):
    """``range`` over interpreter scalars: numpy 2 refuses ``int()`` of a 1-element array,
    which is what the interpreter's own ``__index__`` does with data-dependent loop bounds."""
    return builtins.range(*(_as_int(b) for b in bounds))


def _rebind(fn: types.FunctionType) -> types.FunctionType:
    env = _interpreted_env(fn.__globals__)
    clone = types.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__, fn.__closure__)
    clone.__wrapped__ = fn
    return clone


_LANGUAGE_LOCK = threading.Lock()


def _scalar_tl_range(arg1, arg2=None, step=None, **kwargs):
    """``tl.range`` (``num_stages=`` and friends ignored) over interpreter scalars."""
    start, end = (0, arg1) if arg2 is None else (arg1, arg2)
    return _scalar_range(start, end, 1 if step is None else step)


#: what Triton's interpreter patches: InterpretedFunction.__call__ (a jitted helper called from an
#: interpreted kernel) patches these with interpreter builtins and never restores them, after which
#: every GPU compile in the process fails (e.g. "'block_argument' object has no attribute 'dtype'")
_LANGUAGE_OBJECTS = (tl, tl.core, tl.math, tl.core.tensor, tl.core.tensor_descriptor_base)


@contextlib.contextmanager
def _language_restored():
    saved = [(obj, dict(vars(obj))) for obj in _LANGUAGE_OBJECTS]
    try:
        yield
    finally:
        for obj, attrs in saved:
            for name, value in attrs.items():
                if vars(obj).get(name) is not value:
                    setattr(obj, name, value)
            for name in [n for n in vars(obj) if n not in attrs]:
                delattr(obj, name)


@contextlib.contextmanager
def _interpreted_language():
    with _LANGUAGE_LOCK, _language_restored(), interpreter_gpu_float_semantics(), \
            interpreter_language_extras({"range": _scalar_tl_range}):
        saved = {}
        for module in (tl, tl.math):
            for name, value in list(vars(module).items()):
                if isinstance(value, JITFunction):
                    saved[(module, name)] = value
                    setattr(module, name, InterpretedFunction(_rebind(value.fn)))
        try:
            yield
        finally:
            for (module, name), value in saved.items():
                setattr(module, name, value)


class _InterpretedKernel:
    def __init__(self, kernel: JITFunction):
        self.fn = InterpretedFunction(_rebind(kernel.fn))

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            with _interpreted_language():
                return self.fn[grid](*args, **kwargs)

        return run


def interpreted(kernel: JITFunction) -> _InterpretedKernel:
    """An interpreter-run twin of ``kernel`` (cached), launched as ``twin[grid](*args)``."""
    key = id(kernel)
    if key not in _CACHE:
        _CACHE[key] = _InterpretedKernel(kernel)
    return _CACHE[key]
