"""Recording kernel launches: which Triton kernels, specialised how, a backend's ``launch``
would run on a target -- computed by Triton's own binder on meta tensors, so no GPU is needed.

The ahead-of-time cache never recomputes the JIT's cache hash itself: :func:`record_launches`
runs the real backend ``launch`` while every JIT launch is recorded instead of compiled
(:func:`~paged_mqa_logits.triton_internals.specialise.recording_jit_launches`: Triton's binder
and specialisation for the requested target -- the same calls the JIT makes on a device).
:mod:`~paged_mqa_logits.aot.warmup` uses it to predict the kernels a warm-up compiles;
:mod:`~paged_mqa_logits.aot.precompile` and :mod:`~paged_mqa_logits.aot.verify` build on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch

from ..arch import triton_target
from ..backends import registry
from ..backends.registry import TRITON_BACKENDS  # their launches go through JITFunctions: recordable
from ..triton_internals import compiler, device
from ..triton_internals.specialise import recording_jit_launches


# ============================================================================ targets
def gpu_target(arch: str):
    """Triton's ``GPUTarget`` for ``sm_90`` / ``gfx942`` / ``gfx950`` / ... (what the driver reports)."""
    return triton_target(arch)


def arch_of_target(target) -> str:
    return f"sm_{target.arch}" if target.backend == "cuda" else str(target.arch)


def current_target():
    """The target the JIT compiles for on this process's current GPU."""
    return device.current_target()


# ============================================================================ recording launches
@dataclass
class KernelLaunch:
    """One JIT launch, specialised exactly as ``JITFunction.run`` would on ``target``."""

    kernel: object  # the JITFunction / GluonJITFunction
    target: object  # GPUTarget
    jit_key: str  # the JIT's in-memory cache key (``compute_cache_key``)
    signature: dict
    constexprs: dict
    attrs: dict
    options: object  # the backend's parsed options

    @property
    def name(self) -> str:
        return self.kernel.fn.__qualname__

    def source(self):
        source_cls = compiler.GluonASTSource if self.kernel.is_gluon() else compiler.ASTSource
        return source_cls(self.kernel, self.signature, self.constexprs, self.attrs)

    def disk_key(self) -> str:
        """The hash ``triton.compile`` files this kernel under (same env vars as now)."""
        backend = compiler.make_backend(self.target)
        return compiler.compile_cache_hash(self.source(), backend, backend.parse_options(dict(self.options.__dict__)))


@contextlib.contextmanager
def record_launches(target, sink: list):
    """While active, every ``JITFunction`` launch (any thread) appends a :class:`KernelLaunch`
    to ``sink`` instead of compiling or launching. The specialisation is computed by Triton's own
    binder for ``target``, so tensors may be meta tensors and no GPU is needed."""

    def record(kernel, spec):
        sink.append(KernelLaunch(kernel, target, spec.jit_key, spec.signature, spec.constexprs, spec.attrs,
                                 spec.options))

    with recording_jit_launches(target, record):
        yield sink


def meta_mirror(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor Triton specialises like ``t``: dtype, shape, strides, storage offset (pointer
    alignment) and storage size (AMD's 2 GB pointer-range attribute). Real allocations are at
    least 256-byte aligned, so alignment is decided by the offset alone."""
    storage = t.untyped_storage().nbytes()
    base = torch.empty(max(storage // t.element_size(), 1), dtype=t.dtype, device="meta")
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


def meta_launch_args(args):
    """:class:`LaunchArgs` over meta mirrors of ``args``' tensors (same problem key)."""
    return dataclasses.replace(
        args, q=meta_mirror(args.q), kv_cache=meta_mirror(args.kv_cache), weights=meta_mirror(args.weights),
        out=meta_mirror(args.out), context_lens=meta_mirror(args.context_lens),
        block_table=meta_mirror(args.block_table), q_scale=None if args.q_scale is None else meta_mirror(args.q_scale),
    )


def launches_of(backend_name: str, args, config: dict, target) -> list[KernelLaunch]:
    """The kernels ``backend.launch(args, config)`` would launch on ``target`` (args may be meta)."""
    if backend_name not in TRITON_BACKENDS:
        raise ValueError(f"backend {backend_name!r} does not launch through Triton; nothing to record")
    sink: list[KernelLaunch] = []
    with record_launches(target, sink):
        registry.get(backend_name).launch(args, config)
    return sink

