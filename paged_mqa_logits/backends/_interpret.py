"""Run a ``@triton.jit`` kernel through Triton's interpreter without ``TRITON_INTERPRET=1``.

The interpreter only runs functions wrapped as :class:`InterpretedFunction`, and a kernel
calls its ``@triton.jit`` helpers through its module globals, where they are compiled-mode
``JITFunction`` objects; ``tl.max``/``tl.sum``/``tl.cdiv`` are such functions too.
:func:`interpreted` rebuilds the kernel over a copy of its globals in which every jitted
helper is interpreted, and swaps interpreted twins in for the jitted members of
``triton.language`` for the duration of a launch (under a lock), so CPU tensors run the very
same source the GPU compiles while the module keeps serving GPUs. Loop bounds computed from
loaded values are interpreter arrays of one element, which numpy 2 refuses to turn into ints,
so ``range``/``tl.range`` are replaced by versions that unwrap them. This leans on interpreter
internals of Triton 3.6 (the version CI pins).
"""

from __future__ import annotations

import builtins
import contextlib
import threading
import types

import triton.language as tl
import triton.runtime.interpreter as interpreter
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

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


_ORIGINAL_PATCH_LANG_CORE = interpreter._patch_lang_core


def _patch_lang_core(lang, scope):
    _ORIGINAL_PATCH_LANG_CORE(lang, scope)
    scope.set_attr(lang, "range", _scalar_tl_range)


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


_ORIGINAL_CONVERT_FLOAT = interpreter._convert_float
#: fp8 bit patterns that are NaN (e4m3fn: S.1111.111; e4m3fnuz: the negative zero pattern)
_FP8_NAN = {"fp8e4nv": (0x7F, 0xFF), "fp8e4b8": (0x80,)}


def _convert_float(input, input_dtype, output_dtype, rounding_mode):
    """The interpreter's float conversion, with fp8 NaNs kept NaN as the GPU conversions keep
    them (the interpreter's bit arithmetic turns e4m3fn NaN into 480, e4m3fnuz NaN into 0)."""
    out = _ORIGINAL_CONVERT_FLOAT(input, input_dtype, output_dtype, rounding_mode)
    nans = _FP8_NAN.get(getattr(input_dtype, "name", ""))
    if nans and output_dtype.is_floating() and output_dtype.primitive_bitwidth > 8:
        import numpy as np

        bits = np.frombuffer(input.tobytes(), dtype=np.uint8).reshape(input.shape)
        float_type = {16: np.float16, 32: np.float32, 64: np.float64}[output_dtype.primitive_bitwidth]
        values = out.view(float_type).copy()
        values[np.isin(bits, nans)] = np.nan
        out = values.view(out.dtype)
    return out


def _maxnum(self, lhs, rhs):
    """``maxnum`` as the GPUs compute it (IEEE maxNum: a NaN operand yields the other one);
    the interpreter's is ``np.maximum``, which propagates NaN."""
    import numpy as np

    return self.binary_op(lhs, rhs, np.fmax)


def _minnum(self, lhs, rhs):
    import numpy as np

    return self.binary_op(lhs, rhs, np.fmin)


@contextlib.contextmanager
def _gpu_float_semantics():
    builder = interpreter.InterpreterBuilder
    saved = (interpreter._convert_float, builder.create_maxnumf, builder.create_minnumf)
    interpreter._convert_float, builder.create_maxnumf, builder.create_minnumf = _convert_float, _maxnum, _minnum
    try:
        yield
    finally:
        interpreter._convert_float, builder.create_maxnumf, builder.create_minnumf = saved


@contextlib.contextmanager
def _interpreted_language():
    with _LANGUAGE_LOCK, _language_restored(), _gpu_float_semantics():
        interpreter._patch_lang_core = _patch_lang_core
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
            interpreter._patch_lang_core = _ORIGINAL_PATCH_LANG_CORE


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
