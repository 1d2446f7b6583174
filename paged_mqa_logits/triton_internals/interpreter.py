"""Run a ``@triton.jit`` kernel through Triton's interpreter without ``TRITON_INTERPRET=1``.

The interpreter only runs functions wrapped as ``InterpretedFunction``, and a kernel calls its
``@triton.jit`` helpers through its module globals, where they are compiled-mode
``JITFunction`` objects; ``tl.max``/``tl.sum``/``tl.cdiv`` are such functions too.
:func:`interpreted` rebuilds the kernel over a copy of its globals in which every jitted helper
is interpreted, and swaps interpreted twins in for the jitted members of ``triton.language``
for the duration of a launch (under a lock), so CPU tensors run the very same source the GPU
compiles while the module keeps serving GPUs. Loop bounds computed from loaded values are
interpreter arrays of one element, which numpy 2 refuses to turn into ints, so
``range``/``tl.range`` are replaced by versions that unwrap them. During a launch the
interpreter also computes floats as the GPUs do (:func:`_gpu_float_semantics`).

The patch is process-wide, so launches are serialised with GPU compiles on other threads: an
interpreted launch and every compile's reads of ``triton.language`` (``JITFunction._do_compile``,
``ASTSource.hash`` and the code generator, wrapped once by :func:`serialise_compiles`, so a
direct ``triton.compile`` of any caller is covered too; :func:`compiling` holds it around a
whole compile) hold one lock.

Triton internals touched: ``triton.runtime.jit.JITFunction._do_compile``,
``triton.compiler.compiler.ASTSource.hash``, ``triton.compiler.code_generator.ast_to_ttir`` (wrapped),
``triton.runtime.interpreter`` (``InterpretedFunction``,
``_patch_lang_core`` wrapped, ``_convert_float`` and ``InterpreterBuilder.create_maxnumf`` /
``create_minnumf`` replaced during a launch), ``triton.runtime.jit.JITFunction``; members of
``triton.language``, ``tl.core``, ``tl.math``, ``tl.core.tensor`` and
``tl.core.tensor_descriptor_base`` are replaced during a launch and restored. Verified on
Triton 3.6.0 and 3.9.0.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import threading
import types

_CACHE: dict[int, "InterpretedKernel"] = {}
_ENVS: dict[int, dict] = {}  # id(module globals) -> the interpreted copy of those globals


def _interpreted_env(module_globals: dict) -> dict:
    """A copy of a module's globals whose jitted functions are interpreted (memoised, so
    mutually-referencing helpers and helpers from other modules resolve without recursion)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

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
    import triton.language as tl

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


def _scalar_tl_range(arg1, arg2=None, step=None, **kwargs):
    """``tl.range`` (``num_stages=`` and friends ignored) over interpreter scalars."""
    start, end = (0, arg1) if arg2 is None else (arg1, arg2)
    return _scalar_range(start, end, 1 if step is None else step)


def _rebind(fn: types.FunctionType) -> types.FunctionType:
    env = _interpreted_env(fn.__globals__)
    clone = types.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__, fn.__closure__)
    clone.__wrapped__ = fn
    return clone


@contextlib.contextmanager
def _language_extras(extras: dict):
    """Whenever the interpreter patches a ``triton.language`` module for an interpreted call it
    also sets ``extras`` (name -> object) on it, and restores them with its own patches."""
    import triton.runtime.interpreter as interpreter

    original = interpreter._patch_lang_core

    @functools.wraps(original)
    def patch_lang_core(lang, scope):
        original(lang, scope)
        for name, value in extras.items():
            scope.set_attr(lang, name, value)

    interpreter._patch_lang_core = patch_lang_core
    try:
        yield
    finally:
        interpreter._patch_lang_core = original


#: fp8 bit patterns that are NaN (e4m3fn: S.1111.111; e4m3fnuz: the negative zero pattern)
_FP8_NAN = {"fp8e4nv": (0x7F, 0xFF), "fp8e4b8": (0x80,)}


@contextlib.contextmanager
def _gpu_float_semantics():
    """The interpreter computes floats as the GPUs do: ``maxnum``/``minnum`` are IEEE
    maxNum/minNum (a NaN operand yields the other one; the interpreter's ``np.maximum``
    propagates NaN), and fp8 NaNs stay NaN when widened (its bit arithmetic turns e4m3fn NaN
    into 480, e4m3fnuz NaN into 0)."""
    import numpy as np
    import triton.runtime.interpreter as interpreter

    builder = interpreter.InterpreterBuilder
    saved = (interpreter._convert_float, builder.create_maxnumf, builder.create_minnumf)
    original_convert = saved[0]

    def convert_float(input, input_dtype, output_dtype, rounding_mode):
        out = original_convert(input, input_dtype, output_dtype, rounding_mode)
        nans = _FP8_NAN.get(getattr(input_dtype, "name", ""))
        if nans and output_dtype.is_floating() and output_dtype.primitive_bitwidth > 8:
            bits = np.frombuffer(input.tobytes(), dtype=np.uint8).reshape(input.shape)
            float_type = {16: np.float16, 32: np.float32, 64: np.float64}[output_dtype.primitive_bitwidth]
            values = out.view(float_type).copy()
            values[np.isin(bits, nans)] = np.nan
            out = values.view(out.dtype)
        return out

    def maxnum(self, lhs, rhs):
        return self.binary_op(lhs, rhs, np.fmax)

    def minnum(self, lhs, rhs):
        return self.binary_op(lhs, rhs, np.fmin)

    interpreter._convert_float, builder.create_maxnumf, builder.create_minnumf = convert_float, maxnum, minnum
    try:
        yield
    finally:
        interpreter._convert_float, builder.create_maxnumf, builder.create_minnumf = saved


def _language_objects():
    """What Triton's interpreter patches: ``InterpretedFunction.__call__`` (a jitted helper
    called from an interpreted kernel) patches these with interpreter builtins and never
    restores them, after which every GPU compile in the process fails (e.g.
    "'block_argument' object has no attribute 'dtype'")."""
    import triton.language as tl

    return (tl, tl.core, tl.math, tl.core.tensor, tl.core.tensor_descriptor_base)


@contextlib.contextmanager
def _language_restored():
    saved = [(obj, dict(vars(obj))) for obj in _language_objects()]
    try:
        yield
    finally:
        for obj, attrs in saved:
            for name, value in attrs.items():
                if vars(obj).get(name) is not value:
                    setattr(obj, name, value)
            for name in [n for n in vars(obj) if n not in attrs]:
                delattr(obj, name)


#: held while ``triton.language`` is patched for an interpreted launch, and while a GPU kernel
#: compiles (:func:`serialise_compiles`, :func:`compiling`): the patch is process-wide, so a
#: compile in another thread would otherwise see interpreter objects and fail
_LANGUAGE_LOCK = threading.RLock()


@contextlib.contextmanager
def compiling():
    """Hold while calling ``triton.compile`` directly: no interpreted launch patches the
    language meanwhile (``JITFunction`` compiles take it themselves, :func:`serialise_compiles`)."""
    with _LANGUAGE_LOCK:
        yield


def _holding_the_language_lock(owner, name: str) -> None:
    """Replace ``owner.name`` by a wrapper that holds :data:`_LANGUAGE_LOCK` (once)."""
    original = getattr(owner, name)
    if getattr(original, "serialised_with_the_interpreter", False):
        return

    @functools.wraps(original)
    def locked(*args, **kwargs):
        with _LANGUAGE_LOCK:
            return original(*args, **kwargs)

    locked.serialised_with_the_interpreter = True
    setattr(owner, name, locked)


def serialise_compiles() -> None:
    """Make every compile in the process hold the language lock where it reads
    ``triton.language``, so CPU calls (interpreted) and GPU compiles can run in one process on
    any threads. Idempotent. Wrapped: ``JITFunction._do_compile`` (a launch's cache miss),
    ``ASTSource.hash`` (a kernel's cache key walks its globals, ``tl.max`` included) and
    ``code_generator.ast_to_ttir`` (the code generator: ``ASTSource.make_ir`` and Gluon's import
    it from there at each call). The last two catch the compiles that hold no lock of their own:
    a direct ``triton.compile`` (a cross-compile of another tool or thread), the JIT's async
    compile mode (it compiles after ``_do_compile`` returned)."""
    from triton.compiler import code_generator
    from triton.compiler.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    _holding_the_language_lock(JITFunction, "_do_compile")
    _holding_the_language_lock(ASTSource, "hash")
    _holding_the_language_lock(code_generator, "ast_to_ttir")


@contextlib.contextmanager
def _interpreted_language():
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    serialise_compiles()  # before patching: a compile that starts now waits for the lock
    with _LANGUAGE_LOCK, _language_restored(), _gpu_float_semantics(), _language_extras({"range": _scalar_tl_range}):
        saved = {}
        for module in (tl, tl.math):
            for name, value in list(vars(module).items()):
                if isinstance(value, JITFunction):
                    saved[(module, name)] = value
                    setattr(module, name, InterpretedFunction(_rebind(value.fn)))
        # The interpreter sums and scans with numpy only when the combine function is
        # ``tl.standard._sum_combine``; the interpreted ``tl.sum``/``tl.cumsum`` pass their twin of
        # it, which would otherwise take the element-by-element path (~1000x slower).
        twin = _interpreted_env(vars(tl.standard)).get("_sum_combine")
        if twin is not None:
            saved[(tl.standard, "_sum_combine")] = tl.standard._sum_combine
            tl.standard._sum_combine = twin
        try:
            yield
        finally:
            for (module, name), value in saved.items():
                setattr(module, name, value)


class InterpretedKernel:
    """The interpreter twin of a ``@triton.jit`` kernel, launched as ``twin[grid](*args)``."""

    def __init__(self, kernel):
        from triton.runtime.interpreter import InterpretedFunction

        self.fn = InterpretedFunction(_rebind(kernel.fn))

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            with _interpreted_language():
                return self.fn[grid](*args, **kwargs)

        return run


def interpreted(kernel) -> InterpretedKernel:
    """An interpreter-run twin of ``kernel`` (cached), launched as ``twin[grid](*args)``."""
    key = id(kernel)
    if key not in _CACHE:
        _CACHE[key] = InterpretedKernel(kernel)
    return _CACHE[key]
