"""Host side of the variants that launch the register-MMA kernel (``kernels/register_mma.py``):
``mfma`` (``mfma.py``) and ``mma_v2`` (``mma_v2.py``).

What the two share: the knobs ``ChunkK``, ``SplitKV``, ``ReuseKV``, ``QInLDS``, ``Prefetch``
and ``Schedule``; the rows a program scores; the split count and the grid; the constexprs of
the kernel body. What an arch changes comes from its subclass: the accumulator layout, the
MMA and gather atoms (:meth:`RegisterMmaVariant.atoms`), the heads per MMA with Q in shared
memory, the programs a CU/SM runs at once, and its knobs and resource rules.
"""

from __future__ import annotations

from abc import abstractmethod

from ...problem import LaunchArgs, Problem
from ...schedule import derive_split_kv, persistent_programs
from . import common
from .kernels.register_mma import (register_mma_logits_kernel, register_mma_logits_kernel_key_layout,
                                   weighted_relu_head_sum)
from .variant import GluonVariant

#: tokens per tile (``ChunkK``)
CHUNK_SIZES = (64, 128, 256)


def prefetch_constexpr(prefetch: int):
    """The kernel's ``PREFETCH``: ``False`` / ``True`` for ``Prefetch`` 0 / 1 (the values every
    kernel compiled before ``Prefetch=2`` was given, so those kernels stay as they were), ``2``
    for the two-tile loop."""
    return 2 if int(prefetch) == 2 else bool(prefetch)


def rows_per_program(next_n: int, reuse_kv) -> int:
    """``ReuseKV=0``: one row per program (keys re-read per row, from L2); ``1``: all rows."""
    return next_n if int(reuse_kv or 0) else 1


class RegisterMmaVariant(GluonVariant):
    """A variant running :func:`register_mma_logits_kernel` (see the module docstring)."""

    kernel = register_mma_logits_kernel
    #: heads per MMA when Q is read from shared memory
    head_chunk = 64
    #: whether the cache gathers switch to 32-bit offsets when the cache fits 2^31 bytes
    kv_32bit_loads = False

    # ------------------------------------------------------------------------- arch atoms
    @abstractmethod
    def atoms(self, problem: Problem, knobs: dict) -> dict:
        """The kernel's arch constexprs: ``ACC``, ``K_WIDTH``, ``MMA``, ``LOAD``, ``LOAD_KV``,
        ``THREADS_PER_WARP``; plus ``KEY_LAYOUT`` / ``KEY_OPERAND`` where the keys are gathered in
        another layout than the B operand (then :meth:`kernel_for` picks the kernel taking them)."""

    def kernel_for(self, constexprs: dict):
        return register_mma_logits_kernel_key_layout if "KEY_LAYOUT" in constexprs else register_mma_logits_kernel

    @abstractmethod
    def programs_per_cu(self, knobs: dict) -> int:
        """Programs one CU (SM) runs at once: what ``SplitKV = 0`` and the balanced grid size for."""

    # ------------------------------------------------------------------------- derived
    def rows(self, problem: Problem, knobs: dict) -> int:
        return rows_per_program(problem.shape_key.next_n, knobs["ReuseKV"])

    def num_splits(self, problem: Problem, config: dict) -> int:
        """``SplitKV``, or :func:`schedule.derive_split_kv` for the programs a CU runs when it is 0."""
        knobs = self.knobs(problem, config)
        if knobs["SplitKV"] > 0:
            return knobs["SplitKV"]
        groups = problem.shape_key.next_n // self.rows(problem, knobs)
        return derive_split_kv(problem.cu_num, problem.shape_key.batch * groups, problem.work_context, knobs["ChunkK"],
                               self.programs_per_cu(knobs))

    def program_grid(self, problem: Problem, config: dict) -> tuple[tuple[int], int]:
        """``(grid, num_splits)``: one persistent wave of ``cu_num * programs_per_cu`` programs
        per row group (balanced), or ``batch * splits`` per row group (split)."""
        knobs = self.knobs(problem, config)
        groups = problem.shape_key.next_n // self.rows(problem, knobs)
        if knobs["Schedule"] == common.BALANCED:
            return (persistent_programs(problem.cu_num, self.programs_per_cu(knobs)) * groups,), 1
        splits = self.num_splits(problem, config)
        return (problem.shape_key.batch * splits * groups,), splits

    def constexprs(self, problem: Problem, config: dict, kv_32bit: bool = False) -> dict:
        knobs = self.knobs(problem, config)
        q_lds = knobs["QInLDS"]
        key = problem.shape_key
        return dict(
            NEXT_N=key.next_n, HEADS=key.heads, HEAD_DIM=key.head_dim, KV_BLOCK_SIZE=key.kv_block_size,
            CHUNK=knobs["ChunkK"], ROWS=self.rows(problem, knobs), PRESHUFFLE=key.preshuffle,
            LENS_2D=problem.lens_2d, Q_IN_LDS=bool(q_lds),
            HEAD_CHUNK=min(self.head_chunk, key.heads) if q_lds else key.heads,
            PREFETCH=prefetch_constexpr(knobs["Prefetch"]), KV_32BIT=kv_32bit and self.kv_32bit_loads,
            BALANCED=knobs["Schedule"] == common.BALANCED, HEAD_SUM=self.head_sum(problem, knobs),
            **self.atoms(problem, knobs),
        )

    def head_sum(self, problem: Problem, knobs: dict):
        """The epilogue atom ``HEAD_SUM(scores, scales, weights)``: the fp32 ReLU-weight head sum;
        a variant with a matrix-core head sum (``HeadSum=tensor``) overrides this."""
        return weighted_relu_head_sum

    # ------------------------------------------------------------------------- launch
    def plan_key(self, args: LaunchArgs, config: dict) -> tuple:
        if self.kv_32bit_loads:
            return args.problem, common.config_key(config), common.kv_fits_32bit(args.kv_cache)
        return args.problem, common.config_key(config)

    def plan(self, args: LaunchArgs, config: dict) -> tuple[tuple, int, dict]:
        p = args.problem
        kv_32bit = self.kv_32bit_loads and common.kv_fits_32bit(args.kv_cache)
        grid, splits = self.program_grid(p, config)
        return grid, splits, {**self.constexprs(p, config, kv_32bit), **self.options(p, config)}

    def compile_matrix(self, arch: str) -> list[dict]:
        """Every candidate of every :func:`common.representative_problems` shape."""
        return common.candidate_matrix(arch, self.fp8[arch], self.candidates)
