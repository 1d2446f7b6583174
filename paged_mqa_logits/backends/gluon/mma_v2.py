"""sm_90 register-MMA variant of the ``gluon`` backend: ``mma_v2`` (``mma.sync m16n8k32`` e4m3).

The kernel body is :func:`kernels.register_mma.register_mma_logits_kernel`, the one the AMD MFMA variant
runs; its NVIDIA atoms are ``kernels/mma_v2.py``; this module is the host side. Its purpose is to execute the
AMD path's shared index, mask, gather and epilogue code on our H200 (see docs/VERIFICATION.md);
the fast Hopper kernel is the ``wgmma`` variant.

Atoms:

* accumulator: ``NVMMADistributedLayout`` v2 (``instr_shape [16, 8]``), warps side by side
  along the tokens like the AMD kernel, so the head sum stays inside a warp;
* operands: ``DotOperandLayout`` with ``k_width = 16`` (16 contiguous fp8 per thread), so keys
  and queries are gathered straight into the operand layout with 16-byte ``ld.global``, exactly
  as the AMD kernel does with ``buffer_load_dwordx4``;
* MMA: ``mma_v2``, PTX ``mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32``. sm_90 has no
  native fp8 ``mma.sync``: ptxas unpacks the fp8 operands to f16 (``F2FP.F16.E4M3.UNPACK_B``)
  and runs ``HMMA.16816.F32``; e4m3 -> f16 is exact and the products accumulate in fp32, so
  the numbers are those of a native fp8 MMA, at f16-MMA speed and with twice the operand
  registers;
* loads: ``gl.load`` on 64-bit addresses (the ``KV_32BIT`` flag is ignored).

Query rows are staged in shared memory (``QInLDS = 1``, the default) and multiplied 32 heads
at a time: a warp must hold every head of Q for its tokens, which in registers costs
``H * D / 32`` bytes per thread per row (twice that once unpacked to f16).

Knobs: ``ChunkK`` (64/128/256), ``num_warps`` (4/8), ``SplitKV`` (0 = ``derive_split_kv``
with 2 programs per SM), ``ReuseKV`` (0: a program per query row; 1: a program per sequence
scores every next_n row against each key tile), ``QInLDS`` (0 keeps Q and the weights in
registers: the path the AMD per-row kernel takes), ``Prefetch`` (1: keys of the next tile in
flight while this one is scored; 0: one tile per warp, fewer registers).
"""

from __future__ import annotations

from ...problem import Problem
from ..base import MAX_SPLIT_KV
from . import common
from .kernels.mma_v2 import cache_gather, global_gather, mma_e4m3, mma_layout
from .register_mma import CHUNK_SIZES, RegisterMmaVariant, rows_per_program

NUM_WARPS = (4, 8)
THREADS_PER_WARP = 32
HEAD_CHUNK = 32
#: fp8 per thread per operand register group: 16 = 16-byte gathers straight into the operand
K_WIDTH = 16
#: tokens per warp a tile may give each warp without spilling (unpacked keys + scores)
MAX_TOKENS_PER_WARP = 16
CTAS_PER_SM = 2




# ----------------------------------------------------------------------------- resource rules
def _fits(problem: Problem, chunk: int, warps: int, rows: int, prefetch: int, balanced: bool = False) -> bool:
    """No spills (measured; the f16-unpacked operands make registers the limit): at most 16
    tokens per warp per tile; 32 when a warp holds one tile (``Prefetch = 0``) of 16-byte
    aligned blocks for a single row."""
    tokens = chunk // warps
    if balanced:
        # The segment loop keeps the share's cursor live across the tile loop: measured over
        # the compile matrix, only one tile per warp of exactly 16 tokens never spills.
        return tokens == MAX_TOKENS_PER_WARP and not prefetch
    if tokens <= MAX_TOKENS_PER_WARP:
        return True
    return tokens == 2 * MAX_TOKENS_PER_WARP and not prefetch and rows == 1 and problem.shape_key.kv_block_size % 4 == 0


# ----------------------------------------------------------------------------- the variant
class MmaV2Variant(RegisterMmaVariant):
    name = "mma_v2"
    archs = ("sm_90",)
    knob_space = {"ChunkK": CHUNK_SIZES, "SplitKV": range(0, MAX_SPLIT_KV + 1), "ReuseKV": (0, 1),
                  "num_warps": NUM_WARPS, "QInLDS": (0, 1), "Prefetch": (0, 1), "Schedule": common.SCHEDULES}
    #: not a tuner candidate: on the H200 it ran at 0.09-0.2x of the wgmma variants on widely ragged
    #: batches (benchmarks/h200/). It exists to run the AMD kernel body on the H200 and as a fallback.
    tuned = False
    head_chunk = HEAD_CHUNK

    def knobs(self, problem: Problem, config: dict) -> dict:
        """Backend defaults for unset knobs; an unset ``Prefetch`` is on where it fits, else off."""
        chunk = int(config.get("ChunkK") or 64)
        warps = int(config.get("num_warps") or 4)
        split = int(config.get("SplitKV") or 0)
        reuse = int(config.get("ReuseKV") or 0)
        q_lds = config.get("QInLDS")
        q_lds = 1 if q_lds is None else int(q_lds)
        self.require_in("ChunkK", chunk, CHUNK_SIZES)
        self.require_in("num_warps", warps, NUM_WARPS)
        schedule = self.schedule(problem, config)
        rows = rows_per_program(problem.shape_key.next_n, reuse)
        balanced = schedule == common.BALANCED
        if config.get("Prefetch") is not None:
            prefetch = int(config["Prefetch"])
        else:
            prefetch = 1 if _fits(problem, chunk, warps, rows, 1, balanced) or \
                not _fits(problem, chunk, warps, rows, 0, balanced) else 0
        return {"ChunkK": chunk, "SplitKV": split, "ReuseKV": reuse, "num_warps": warps, "QInLDS": q_lds,
                "Prefetch": prefetch, "Schedule": schedule}

    def admits(self, problem: Problem, config: dict) -> bool:
        knobs = self.knobs(problem, config)
        return _fits(problem, knobs["ChunkK"], knobs["num_warps"], self.rows(problem, knobs), knobs["Prefetch"],
                     knobs["Schedule"] == common.BALANCED)

    def candidate_groups(self, problem: Problem):
        for schedule in common.SCHEDULES:
            for reuse in ((0, 1) if problem.shape_key.next_n > 1 else (0,)):
                for chunk in CHUNK_SIZES:
                    for warps in NUM_WARPS:
                        # register-double-buffered tiles where they fit, else one tile per warp
                        yield [{"ChunkK": chunk, "SplitKV": 0, "ReuseKV": reuse, "num_warps": warps, "QInLDS": 1,
                                "Prefetch": prefetch, "Schedule": schedule} for prefetch in (1, 0)]

    def default_config(self, problem: Problem) -> dict:
        schedule = common.default_schedule(problem)
        return {"variant": self.name, "ChunkK": 128, "SplitKV": 0, "ReuseKV": 1 if problem.shape_key.next_n > 1 else 0,
                "num_warps": 8, "QInLDS": 1, "Prefetch": int(schedule == common.SPLIT), "Schedule": schedule}

    def atoms(self, problem: Problem, knobs: dict) -> dict:
        return dict(ACC=mma_layout(knobs["num_warps"]), K_WIDTH=K_WIDTH, MMA=mma_e4m3, LOAD=global_gather,
                    LOAD_KV=cache_gather, THREADS_PER_WARP=THREADS_PER_WARP)

    def programs_per_cu(self, knobs: dict) -> int:
        return CTAS_PER_SM

    def options(self, problem: Problem, config: dict) -> dict:
        return {"num_warps": self.knobs(problem, config)["num_warps"]}

    def compile_matrix(self, arch: str) -> list[dict]:
        """Every candidate of ``common.representative_problems``, plus the register-Q path."""
        out = super().compile_matrix(arch)
        for heads in (32, 64):
            out.append({"heads": heads, "next_n": 2, "kv_block_size": 64, "preshuffle": False, "lens_2d": True,
                        "variant": self.name, "ChunkK": 64, "SplitKV": 0, "ReuseKV": 0, "num_warps": 8, "QInLDS": 0,
                        "Prefetch": 1, "Schedule": common.BALANCED})
        return out


VARIANT = MmaV2Variant()
