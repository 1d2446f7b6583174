"""The small interface every backend implements, and the shapes its tooling exchanges.

A backend answers five questions and does one thing:

* ``unsupported(problem) -> str | None``: why it cannot serve this call (``None`` = it can),
  judged from what the call *is*: arch, shapes, fp8 flavour, cache layout. A problem carries
  nothing about this machine, so the verdict is the same for a call made here and one only
  described (``explain``, ``compile --only-table``, the tuner's dry run, table checks). Must be
  cheap, host-only, and must not import optional heavy packages at module import time.
* ``unavailable(target) -> str | None``: why this machine cannot launch the backend's kernels
  for ``target`` (a :class:`~paged_mqa_logits.problem.Target`: the chip and the tensors' device
  type), e.g. GPU kernels for CPU tensors, a runtime or optional package missing; ``None`` =
  it can. Dispatch asks it only for a target that is not ``hypothetical``, after
  ``unsupported`` (``registry.why_not``); cheap and host-only as well.
* ``candidates(problem) -> list[dict]``: the knob sets the tuner may time for this problem.
* ``default_config(problem) -> dict``: knobs used when the table names the backend without
  knobs, or when dispatch falls back to this backend.
* ``check_config(config, problem=None) -> str | None``: ``None`` when every knob of ``config``
  is one this backend reads with a value it accepts (for ``problem``, else for any problem it
  serves), otherwise a message naming the knob and listing the allowed values. Host-only. The
  tables check every row with it when they load; ``launch`` is only given configs it accepts.
* ``launch(args, config) -> None``: write the logits of ``args`` (a :class:`LaunchArgs`)
  into ``args.out`` following the output contract, with no host-device synchronisation, and
  ``args.clean_logits``' ``-inf`` too where :func:`kernel_writes_tails` says its kernel does.
* ``writes_tails(problem, config) -> bool`` (optional; absent: never): whether ``config``'s
  kernel writes ``clean_logits``' ``-inf`` itself; where it does not, the op launches the tail
  kernel (``backends/clean_tail.py``) after it.

Knob dictionaries use the CSV column names (``ChunkK``, ``WavePerEU``, ``SplitKV``, plus any
backend-specific ones such as ``num_warps``). ``None`` values mean "backend default". A backend
declares its knobs' allowed values as a ``KNOB_SPACE`` (knob -> tuple of values or ``range``),
checked by :func:`check_knob_space`.

A backend that can be cross-compiled without a GPU offers one of two capabilities, which the
compile driver (``compile.py``) asks for through these protocols:

* :class:`SpecCompiled` (Triton/Gluon kernels): ``compile_specs(arch, configs)`` returns
  :class:`CompileSpec` s that the driver compiles with Triton;
* :class:`SelfCompiled` (FlyDSL): ``compile_records(arch, out_dir, configs)`` builds its kernels
  itself and returns :class:`CompileRecord` s.

``configs`` is ``None`` for the backend's whole knob space, or the tuned table's configs (row
fields merged with the row's knobs) to build only those.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable

from ..files import atomic_write
from ..problem import LaunchArgs, Problem, Target


class Backend(Protocol):
    name: str
    #: knob names this backend reads, in CSV column spelling
    knobs: tuple[str, ...]

    def unsupported(self, problem: Problem) -> str | None: ...

    def unavailable(self, target: Target) -> str | None: ...

    def candidates(self, problem: Problem) -> list[dict]: ...

    def default_config(self, problem: Problem) -> dict: ...

    def check_config(self, config: dict, problem: Problem | None = None) -> str | None: ...

    def launch(self, args: LaunchArgs, config: dict) -> None: ...


def kernel_writes_tails(backend, problem: Problem, config: dict) -> bool:
    """Whether ``backend``'s kernel for ``config`` writes ``clean_logits``' ``-inf`` itself (else
    the tail kernel writes it): the backend's ``writes_tails``, ``False`` for one without it."""
    writes = getattr(backend, "writes_tails", None)
    return bool(writes is not None and writes(problem, config))


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


def formats_unsupported(owner: str, problem: Problem, kv_formats=("fp8",), logits_dtypes=("fp32",)) -> str | None:
    """Why ``owner``'s kernels cannot serve ``problem``'s query/key format or logits dtype
    (``None``: they read ``problem.shape_key.kv_format`` and write its ``logits_dtype``): the first
    check of ``unsupported`` in a backend whose kernels serve only some of them."""
    key = problem.shape_key
    if key.kv_format not in kv_formats:
        return f"{owner} kernels read {'/'.join(kv_formats)} queries and keys, not {key.kv_format}"
    if key.logits_dtype not in logits_dtypes:
        return f"{owner} kernels write {'/'.join(logits_dtypes)} logits, not {key.logits_dtype}"
    return None


# ============================================================================ cross-compilation
@dataclass
class CompileSpec:
    """One kernel to build: the jitted function, its signature and constexprs, compile options
    (num_warps, waves_per_eu, ...) and the knobs it realises. Backends produce specs; the
    compile driver compiles them."""

    name: str  # unique, filesystem-safe: backend_variant_arch_shape_knobs
    backend: str
    arch: str  # "gfx942" | "gfx950" | "sm_90"
    knobs: dict  # the CSV knobs this kernel realises (ChunkK, WavePerEU, num_warps, variant, ...)
    fn: object  # the @gluon.jit / @triton.jit function
    signature: dict  # argument name -> Triton type string ("*u8", "*fp32", "i32", "i64", "constexpr")
    constexprs: dict  # constexpr argument name -> value
    options: dict = field(default_factory=dict)  # num_warps, num_stages, waves_per_eu, ...
    gluon: bool = True  # compile through GluonASTSource instead of ASTSource
    #: argument attributes as the JIT passes them ({(index,): [["tt.divisibility", 16]], ...})
    attrs: dict = field(default_factory=dict)


@dataclass
class CompileRecord:
    """One compiled kernel: where its files are, the resources the compiler reported, and the
    matrix instructions found in its ISA."""

    name: str  # unique, filesystem-safe: backend_variant_arch_knobs
    backend: str  # "gluon" | "flydsl" | ...
    arch: str  # "gfx942" | "gfx950" | "sm_90"
    knobs: dict
    ok: bool
    error: str | None = None
    binary: str | None = None  # path of the .hsaco / .cubin
    isa: str | None = None  # path of the .amdgcn / .ptx (+ .sass when available) text
    vgprs: int | None = None  # AMD: VGPRs (arch VGPRs + AGPRs); NVIDIA: registers per thread
    sgprs: int | None = None
    lds_bytes: int | None = None  # LDS (AMD) / shared memory (NVIDIA) bytes per workgroup
    scratch_bytes: int | None = None  # private segment / local memory bytes per lane
    spill_count: int | None = None  # AMD: VGPR+SGPR spills; NVIDIA: 1 if the kernel has stack/local memory
    occupancy: int | None = None  # waves per SIMD (AMD) or CTAs per SM (NVIDIA) if reported
    mma_instructions: list[str] = field(default_factory=list)  # distinct MFMA / MMA mnemonics
    agprs: int | None = None  # AMD: AGPRs (already included in ``vgprs``)
    options: dict = field(default_factory=dict)  # compile options (num_warps, waves_per_eu, ...)
    seconds: float | None = None  # wall-clock compile time

    def write(self, out_dir: str) -> str:
        path = os.path.join(out_dir, f"{self.name}.json")
        with atomic_write(path) as f:
            json.dump(asdict(self), f, indent=1, sort_keys=True)
        return path


@runtime_checkable
class SpecCompiled(Protocol):
    """A backend whose kernels the compile driver builds with Triton."""

    def compile_specs(self, arch: str, configs: list[dict] | None = None) -> list[CompileSpec]: ...


@runtime_checkable
class SelfCompiled(Protocol):
    """A backend that builds its own kernels for an arch (its compiler is not Triton)."""

    def compile_records(self, arch: str, out_dir: str | None,
                        configs: list[dict] | None = None) -> list[CompileRecord]: ...
