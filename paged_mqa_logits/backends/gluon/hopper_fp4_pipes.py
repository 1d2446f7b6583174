"""Host side of the sm_90 ``wgmma_fp4_pipes`` variant (its kernel: ``kernels/hopper_fp4_pipes.py``):
MXFP4 keys widened to e4m3 by producer warpgroups into the ring the ``wgmma_pipes`` consumers read.

It serves what ``wgmma_fp4`` serves (``kv_format == "fp4"``, plain caches, fp32 / bf16 logits,
heads up to one wgmma's N) and writes ``clean_logits``' ``-inf`` itself, as ``wgmma_pipes`` does.
It has never run on a GPU: ``wgmma_fp4`` stays the default for every MXFP4 call (it is listed
first in ``VARIANT_MODULES``) and no table row names this variant.

Knobs: ``Consumers`` (1 or 2 consumer warpgroups), ``RowSplit`` (1, or 2: two consumers share a
tile's row groups), ``RowsPerMMA``, ``num_stages`` (ring slots per team), ``CtasPerSM``,
``Overlap``, ``Schedule``, ``SplitKV``: those of ``wgmma_pipes`` less ``KeyCopy`` (the keys are
always loaded into the producer's registers). Every team has a producer warpgroup
(``PRODUCER_WARPS``), so a program has ``4 * (Consumers + teams)`` warps.
"""

from __future__ import annotations

from ...arch import lds_limit
from ...problem import LaunchArgs, Problem
from ..base import MAX_SPLIT_KV
from . import common
from . import hopper_fp4 as hf
from . import hopper_pipes as hp
from . import hopper_wgmma as wg
from .kernels.hopper_fp4_pipes import CONSUMER_WARPS, PRODUCER_WARPS, TILE, fp4_pipes_logits_kernel
from .variant import LaunchPlan

#: registers per thread of a producer warpgroup (``setmaxnreg``): the walk's state, the current
#: and the prefetched tile (8 packed words and 2 exponent words each per thread), the table
#: words and the 16 widened words being stored, the next tile's addresses. Its tile loop is free
#: of local memory from 56 on (ptxas, Triton 3.6: tried 56-104); 104 also keeps the per-sequence
#: Q widening of 64 heads x next_n 4 (32 words a thread, beside the first tile's loads) out of
#: local memory (88 left 38 local accesses there). Checked by
#: tests/backends/gluon/test_compile_hopper_fp4_pipes.py.
PRODUCER_REGS = 104


#: shared memory the compiler adds to the pipes' buffers (layout-conversion scratch of the
#: widening, alignment): 1032 bytes measured at 64 heads x next_n 4 (Triton 3.6), rounded up
SCRATCH_BYTES = 2048


def teams(consumers: int, split: int) -> int:
    return consumers // split


def program_warps(consumers: int, split: int) -> int:
    """The consumer warpgroups and one producer warpgroup per team."""
    return CONSUMER_WARPS * consumers + PRODUCER_WARPS * teams(consumers, split)


def max_registers(ctas: int, consumers: int, split: int) -> int:
    """``maxnreg`` for ``ctas`` programs per SM (a multiple of 8)."""
    return min(256, wg.SM_REGISTERS // (ctas * program_warps(consumers, split) * 32) // 8 * 8)


def register_split(ctas: int, consumers: int, split: int) -> tuple[int, int]:
    """``(consumer, producer)`` registers per thread: the program's registers less the producer
    warpgroups' :data:`PRODUCER_REGS`, shared equally by the consumers."""
    pool = (consumers + teams(consumers, split)) * max_registers(ctas, consumers, split)
    consumer = min(256, (pool - teams(consumers, split) * PRODUCER_REGS) // consumers // 8 * 8)
    return consumer, PRODUCER_REGS


def shared_bytes(problem: Problem, stages: int, consumers: int, split: int) -> int:
    """The pipes' rings (``hopper_pipes.shared_bytes``) and the compiler's scratch."""
    return hp.shared_bytes(problem, stages, consumers, split) + SCRATCH_BYTES


def fits(problem: Problem, rows: int, stages: int, consumers: int, split: int, ctas: int,
         schedule: str = common.BALANCED, overlap: int = 0) -> bool:
    """``hopper_pipes.fits``' rules under this program's register split and warps: every consumer
    part has a row group (exactly one when overlapped), the consumers' registers, the widest
    wgmma under ``maxnreg`` and ``ctas`` programs' shared memory (the pipes' buffers) fit."""
    groups = wg.problem_row_groups(problem, rows)
    if len(groups) < split or (overlap and len(hp.consumer_groups(problem, rows, split)) != 1):
        return False
    widest = max(r for _, r in groups) * problem.shape_key.heads
    smem = shared_bytes(problem, stages, consumers, split)
    return (hp.consumer_need(problem, rows, split, schedule, overlap) <= register_split(ctas, consumers, split)[0]
            and widest // 2 * (1 + overlap) + hp.WGMMA_OPERAND_REGS <= max_registers(ctas, consumers, split)
            and smem <= lds_limit("sm_90") and ctas * (smem + 1024) <= wg.SM_SHARED_BYTES)


class Fp4PipesVariant(hp.WgmmaPipesVariant):
    """The pipes consumers fed by widening producer warpgroups (see the kernel)."""

    name = "wgmma_fp4_pipes"
    kv_formats = ("fp4",)
    knob_space = {"ChunkK": (TILE,), "RowsPerMMA": (1, 2, 4, 8), "num_stages": range(2, 7),
                  "Consumers": (1, 2), "RowSplit": (1, 2), "CtasPerSM": (1, 2), "Overlap": (0, 1),
                  "Schedule": common.SCHEDULES, "SplitKV": range(0, MAX_SPLIT_KV + 1), "num_warps": (CONSUMER_WARPS,)}
    kernel = fp4_pipes_logits_kernel
    cleans_logits = True

    #: (Consumers, RowSplit, CtasPerSM, ring depths, Overlap): two consumers with whole tiles
    #: (two producers) or in a pair (one producer); one consumer per program, two programs per
    #: SM; overlapped consumers where their second accumulators fit. One ring depth each: at
    #: most 8 candidates with both schedules, until the H200 says which depths matter
    TEAM_SHAPES = ((2, 1, 1, (3,), 0), (2, 2, 1, (4,), 0), (1, 1, 2, (4,), 0), (2, 1, 1, (4,), 1))

    # ------------------------------------------------------------------------- knobs
    def knobs(self, problem: Problem, config: dict) -> dict:
        """``wgmma_pipes``' knobs less ``KeyCopy``."""
        k = super().knobs(problem, dict(config, KeyCopy="gather"))
        k.pop("KeyCopy")
        return k

    def admits(self, problem: Problem, config: dict) -> bool:
        k = self.knobs(problem, config)
        return fits(problem, k["RowsPerMMA"], k["num_stages"], k["Consumers"], k["RowSplit"], k["CtasPerSM"],
                    k["Schedule"], k["Overlap"])

    def shape_reason(self, problem: Problem) -> str | None:
        key = problem.shape_key
        if key.preshuffle:
            return "a preshuffled MXFP4 cache is not read by this kernel (plain layout only)"
        return super().shape_reason(problem)

    # ------------------------------------------------------------------------- candidates
    @staticmethod
    def _setting(rows: int, stages: int, consumers: int, split: int, ctas: int, schedule: str,
                 overlap: int = 0) -> dict:
        return {"ChunkK": TILE, "RowsPerMMA": rows, "num_stages": stages, "Consumers": consumers, "RowSplit": split,
                "CtasPerSM": ctas, "Overlap": overlap, "SplitKV": 0, "num_warps": CONSUMER_WARPS,
                "Schedule": schedule}

    def candidate_groups(self, problem: Problem):
        """Per team shape, ring depth and schedule, the widest row grouping that fits."""
        schedules = (common.BALANCED, common.SPLIT) if problem.shape_key.batch < 64 else (common.BALANCED,)
        for consumers, split, ctas, depths, overlap in self.TEAM_SHAPES:
            for stages in depths:
                for schedule in schedules:
                    yield [self._setting(rows, stages, consumers, split, ctas, schedule, overlap)
                           for rows in wg._rows_options(problem)]

    # ------------------------------------------------------------------------- launch plan
    def constexprs(self, problem: Problem, config: dict) -> dict:
        k = self.knobs(problem, config)
        key = problem.shape_key
        consumer, producer = register_split(k["CtasPerSM"], k["Consumers"], k["RowSplit"])
        return dict(NEXT_N=key.next_n, NEXT_N_POW2=wg.triton_next_pow2(key.next_n), HEADS=key.heads,
                    KV_BLOCK_SIZE=key.kv_block_size, ROWS_PER_MMA=wg.rows_per_mma(problem, k["RowsPerMMA"]),
                    STAGES=k["num_stages"], LENS_2D=problem.lens_2d, BALANCED=k["Schedule"] == common.BALANCED,
                    CONSUMERS=k["Consumers"], ROW_SPLIT=k["RowSplit"], OVERLAP=k["Overlap"],
                    CONSUMER_REGS=consumer, PRODUCER_REGS=producer)

    def options(self, problem: Problem, config: dict) -> dict:
        k = self.knobs(problem, config)
        return {"num_warps": CONSUMER_WARPS, "maxnreg": max_registers(k["CtasPerSM"], k["Consumers"], k["RowSplit"])}

    def call_constexprs(self, args: LaunchArgs) -> dict:
        return {}  # plain loads: no alignment path

    def plan(self, args: LaunchArgs, config: dict) -> LaunchPlan:
        p = args.problem
        grid, splits = self.grid(p, config)
        return LaunchPlan(grid, splits, {**self.constexprs(p, config), **self.options(p, config)}, None)

    def call_parts(self, args: LaunchArgs, plan: LaunchPlan) -> tuple[tuple, dict]:
        """The query exponents and the ``clean_logits`` flag after the common arguments."""
        q_scale = args.q_scale
        return (q_scale, q_scale.stride(0), q_scale.stride(1), int(args.clean_logits)), {}

    # ------------------------------------------------------------------------- compile specs
    spec_problem = hf.Fp4WgmmaVariant.spec_problem

    def spec_arguments(self, problem: Problem, cfg: dict) -> tuple[tuple, dict, dict]:
        """``wgmma_fp4``'s typical MXFP4 call, then ``clean_logits``."""
        runtime, _, _ = hf.Fp4WgmmaVariant.spec_arguments(self, problem, cfg)
        return runtime + (0,), self.constexprs(problem, cfg), {}

    def kernel_key(self, problem: Problem, cfg: dict) -> tuple:
        return tuple(sorted(self.constexprs(problem, cfg).items())), self.knobs(problem, cfg)["CtasPerSM"]

    def compile_matrix(self, arch: str) -> list[dict]:
        """Every candidate and the default of H 32/64 x next_n 1/2/3/4 x KVBlockSize 32/64 (plain
        cache, 2-D lengths), and the default with bf16 logits, deduplicated by kernel."""
        return common.deduplicated_matrix(self, arch)


VARIANT = Fp4PipesVariant()
