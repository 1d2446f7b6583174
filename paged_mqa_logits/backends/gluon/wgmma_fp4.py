"""Host side of the sm_90 ``wgmma_fp4`` variant (its kernel: ``kernels/wgmma_fp4.py``): MXFP4
queries and keys widened to e4m3 in registers and scored by fp8 wgmma.

It serves only ``kv_format == "fp4"`` (every other variant serves only fp8), fp32 and bf16
logits, plain (not preshuffled) caches; the rest of the rules are the ``wgmma`` variant's
(``wgmma.py``: heads a power of two in 16..256, row groups, schedules, split rule), which
this class extends.

Knobs: ``ChunkK`` (64/128 tokens per tile), ``RowsPerMMA``, ``Schedule``, ``SplitKV``,
``CtasPerSM``, ``num_warps`` (always 4), ``HeadSum``: those of ``wgmma`` less ``num_stages`` (the keys
are prefetched one tile ahead in registers, not through a shared-memory ring). Candidates: the two
widest row groupings that fit x ChunkK 64/128 x both schedules, then each with ``HeadSum=tensor``
where :func:`tensor_fits` admits it (the head sum on the tensor cores leaves the warpgroup's issue
slots to the widening).
"""

from __future__ import annotations

import dataclasses

import torch

from ...arch import lds_limit
from ...problem import LaunchArgs, Problem
from ...triton_internals.specialise import StandIn
from ..base import MAX_SPLIT_KV
from . import common
from . import wgmma as wg
from ...fp4 import ue8m0_bytes
from .kernels.wgmma_fp4 import (E4M3_SPREAD_LIMIT, HIGH_BASE, HIGH_STEP, LOW_BASE, LOW_STEP, SIGN_HIGH_SELECTOR,
                                 SIGN_LOW_SELECTOR,
                                 SUBNORMAL_HIGH_WORDS, SUBNORMAL_LOW_WORDS, fp4_wgmma_logits_kernel)
from .kernels.wgmma import HEAD_DIM, NUM_WARPS

CHUNK_SIZES = (64, 128)
#: registers per thread beyond the accumulators and weights (``wg.resources``' 36 for addresses
#: and loop state) that the prefetched tile and the widening hold: 8 packed words and one
#: exponent word per 64 tokens, the table words and the widened words being stored
PREFETCH_REGS = {64: 24, 128: 40}


def resources(problem: Problem, chunk: int, rows: int, head_sum: str = "fp32") -> dict:
    """``wg.resources`` with this kernel's footprint: one widened key tile and its factors in
    shared memory (no ring), Q widened, the weights and row limits (and the head-sum weights); the
    prefetched words in registers."""
    base = wg.resources(problem, chunk, rows, 2, head_sum)
    key = problem.shape_key
    q_rows = wg.triton_next_pow2(key.next_n) * key.heads
    smem = chunk * (HEAD_DIM + 4) + q_rows * (HEAD_DIM + 4) + 4 * wg.triton_next_pow2(key.next_n)
    if head_sum == "tensor":
        smem += wg.headsum_bytes(problem, rows, 1, 1)
    regs = min(255, base["regs_estimate"] + PREFETCH_REGS[chunk])
    by_regs = wg.SM_REGISTERS // ((-(-regs // 8) * 8) * 32 * NUM_WARPS)
    by_smem = wg.SM_SHARED_BYTES // (smem + 1024)  # the driver reserves 1 KB per program
    return dict(base, regs_estimate=regs, smem=smem, ctas_per_sm=max(1, min(by_regs, by_smem, 8)))


def fits(problem: Problem, chunk: int, rows: int) -> bool:
    r = resources(problem, chunk, rows)
    return r["acc_regs"] <= r["acc_budget"] and r["smem"] <= lds_limit("sm_90")


def tensor_fits(problem: Problem, chunk: int, rows: int) -> bool:
    """``HeadSum=tensor``: ``wgmma``'s rule with the prefetched words' registers beside the head
    sum's, and this kernel's shared memory."""
    return (wg.tensor_fits(problem, chunk, rows, 2, PREFETCH_REGS[chunk])
            and resources(problem, chunk, rows, "tensor")["smem"] <= lds_limit("sm_90"))


# ----------------------------------------------------------------------------- the widening's torch model
# The kernel's formulas (kernels/wgmma_fp4.py: ``_table_words``, ``_WIDEN_ASM``, ``_row_factor``)
# in plain torch on 32-bit words held in int64 tensors, bit for bit: what the CPU tests check.

def e4m3_table_words(spread: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two words of e4m3 bytes of the magnitudes ``E2M1_VALUES * 2^(6 - spread)`` (int64
    tensors holding 32-bit words): codes 0-3 and 4-7, one byte each, code 0 in the low byte.
    ``spread`` past ``E4M3_SPREAD_LIMIT`` gives zeros."""
    spread = spread.long()
    low = LOW_BASE + (12 - spread) * LOW_STEP
    high = HIGH_BASE + (12 - spread) * HIGH_STEP
    for value, word in SUBNORMAL_LOW_WORDS.items():
        low = torch.where(spread == value, word, low)
    for value, word in SUBNORMAL_HIGH_WORDS.items():
        high = torch.where(spread == value, word, high)
    beyond = spread > E4M3_SPREAD_LIMIT
    return torch.where(beyond, 0, low) & 0xFFFFFFFF, torch.where(beyond, 0, high) & 0xFFFFFFFF


def prmt(a: torch.Tensor, b: torch.Tensor, selector: torch.Tensor) -> torch.Tensor:
    """PTX ``prmt.b32 d, a, b, c`` (default mode) on 32-bit words held in int64 tensors: byte
    ``i`` of ``d`` is byte ``c[4i + 2 : 4i]`` of the eight bytes ``b:a`` (``a`` the low four), or
    that byte's top bit copied into all eight bits when ``c[4i + 3]`` is set."""
    a, b, selector = torch.broadcast_tensors(a.long(), b.long(), selector.long())
    source = a | (b << 32)
    out = torch.zeros_like(a)
    for i in range(4):
        nibble = (selector >> (4 * i)) & 0xF
        byte = (source >> (8 * (nibble & 7))) & 0xFF
        byte = torch.where(nibble & 8 != 0, ((byte >> 7) & 1) * 0xFF, byte)
        out |= byte << (8 * i)
    return out


def widen_word(word: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight codes of a packed 32-bit word (4 bytes, element ``2i`` in the low nibble: the
    nibbles are in element order) -> two words of e4m3 bytes, elements 0-3 and 4-7, through the
    group's table words ``(low, high)``: each magnitude byte by a ``prmt`` on the code's 3 bits,
    the sign bits gathered by a byte ``prmt`` of ``word << 4`` and ``word``."""
    word = word.long() & 0xFFFFFFFF
    selector = word & 0x77777777
    shifted = (word << 4) & 0xFFFFFFFF
    first = prmt(low, high, selector) | (prmt(shifted, word, torch.tensor(SIGN_LOW_SELECTOR)) & 0x80808080)
    second = prmt(low, high, selector >> 16) | (prmt(shifted, word, torch.tensor(SIGN_HIGH_SELECTOR)) & 0x80808080)
    return first, second


def widen_to_e4m3(packed: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's widening of MXFP4 rows ``packed [..., 64]`` uint8 with exponent words
    ``scale [...]``: ``(e4m3 bytes [..., 128] uint8, M [...] int64)`` where each row's values are
    ``e4m3 * 2^(M - 127 - 6)`` (exactly, while no group sits more than
    ``E4M3_SPREAD_LIMIT`` binades below ``M``, the row's largest exponent)."""
    exponents = ue8m0_bytes(scale).long()  # [..., 4]
    top = exponents.amax(dim=-1)
    low, high = e4m3_table_words(top[..., None] - exponents)  # [..., 4] per group
    words = packed.contiguous().view(torch.int32).long().unflatten(-1, (4, 4))  # [..., group, word]
    first, second = widen_word(words, low[..., None], high[..., None])
    out = torch.stack((first, second), dim=-1).flatten(-3).to(torch.int32)  # [..., 32] words
    return out.contiguous().view(torch.uint8), top


def scale_of_exponent(top: torch.Tensor) -> torch.Tensor:
    """fp32 ``2^(M - 127 - 6)`` of a row's largest exponent ``M`` (0..255), from the bits as the
    kernel builds it: a normal fp32 from ``M = 7`` on, the subnormal ``2^(M - 133)`` below."""
    top = top.to(torch.int32)
    bits = torch.where(top > 6, (top - 6) << 23, 1 << (top + 16))
    return bits.view(torch.float32)


class Fp4WgmmaVariant(wg.WgmmaVariant):
    name = "wgmma_fp4"
    kv_formats = ("fp4",)
    knob_space = {"ChunkK": CHUNK_SIZES, "RowsPerMMA": (1, 2, 4, 8), "SplitKV": range(0, MAX_SPLIT_KV + 1),
                  "CtasPerSM": range(0, 9), "num_warps": (NUM_WARPS,), "Schedule": common.SCHEDULES,
                  "HeadSum": common.HEAD_SUMS}
    kernel = fp4_wgmma_logits_kernel

    # ------------------------------------------------------------------------- knobs
    def knobs(self, problem: Problem, config: dict) -> dict:
        default = self.default_config(problem) if any(config.get(k) is None for k in ("ChunkK", "RowsPerMMA")) \
            else {}
        chunk = int(config.get("ChunkK") or default["ChunkK"])
        rows = int(config.get("RowsPerMMA") or default["RowsPerMMA"])
        self.require_in("ChunkK", chunk, CHUNK_SIZES)
        self.require(rows >= 1 and not rows & (rows - 1), "RowsPerMMA", rows, "a power of two")
        self.require(rows * problem.shape_key.heads <= wg.MAX_MMA_N, "RowsPerMMA", rows,
                     f"RowsPerMMA x heads <= {wg.MAX_MMA_N} (wgmma's largest N), "
                     f"got {rows} x {problem.shape_key.heads} heads")
        warps = int(config.get("num_warps") or NUM_WARPS)
        self.require(warps == NUM_WARPS, "num_warps", warps, f"{NUM_WARPS} (one warpgroup)")
        split = int(config.get("SplitKV") or 0)
        ctas = int(config.get("CtasPerSM") or 0)
        self.require(split >= 0, "SplitKV", split, "an integer >= 0")
        self.require(ctas >= 0, "CtasPerSM", ctas, "an integer >= 0")
        return {"ChunkK": chunk, "RowsPerMMA": rows, "SplitKV": split, "CtasPerSM": ctas, "num_warps": NUM_WARPS,
                "Schedule": self.schedule(problem, config), "HeadSum": self.head_sum_knob(problem, config, rows)}

    def admits(self, problem: Problem, config: dict) -> bool:
        k = self.knobs(problem, config)
        if k["HeadSum"] == "tensor":
            return tensor_fits(problem, k["ChunkK"], k["RowsPerMMA"])
        return fits(problem, k["ChunkK"], k["RowsPerMMA"])

    def shape_reason(self, problem: Problem) -> str | None:
        key = problem.shape_key
        if key.preshuffle:
            return "a preshuffled MXFP4 cache is not read by this kernel (plain layout only)"
        if key.heads > wg.MAX_MMA_N:
            return f"heads must be <= {wg.MAX_MMA_N} (one wgmma N covers all heads of a row), got {key.heads}"
        if not fits(problem, 64, 1):
            return f"no tile configuration fits sm_90's registers and shared memory for {problem.describe()}"
        return None

    # ------------------------------------------------------------------------- candidates
    def fp32_candidates(self, problem: Problem):
        groupings = 0
        for rows in wg.rows_options(problem):
            chunks = [chunk for chunk in CHUNK_SIZES if fits(problem, chunk, rows)]
            for chunk in chunks:
                for schedule in (common.BALANCED, common.SPLIT):
                    yield [{"ChunkK": chunk, "RowsPerMMA": rows, "SplitKV": 0, "CtasPerSM": 0,
                            "num_warps": NUM_WARPS, "Schedule": schedule, "HeadSum": "fp32"}]
            groupings += bool(chunks)
            if groupings == 2:
                break

    def default_config(self, problem: Problem) -> dict:
        """The widest row grouping that fits, 64-token tiles (128 where a group is at most 64
        columns wide), the default schedule: usable without a table row."""
        for rows in wg.rows_options(problem):
            for chunk in ((128, 64) if rows * problem.shape_key.heads <= 64 else (64, 128)):
                if fits(problem, chunk, rows):
                    return {"variant": self.name, "ChunkK": chunk, "RowsPerMMA": rows, "SplitKV": 0, "CtasPerSM": 0,
                            "num_warps": NUM_WARPS, "Schedule": common.default_schedule(problem), "HeadSum": "fp32"}
        raise ValueError(f"{self.owner}: no configuration fits {problem.describe()}")

    # ------------------------------------------------------------------------- launch plan
    def programs_per_sm(self, problem: Problem, config: dict) -> int:
        k = self.knobs(problem, config)
        return k["CtasPerSM"] or resources(problem, k["ChunkK"], k["RowsPerMMA"], k["HeadSum"])["ctas_per_sm"]

    def constexprs(self, problem: Problem, config: dict) -> dict:
        k = self.knobs(problem, config)
        key = problem.shape_key
        return dict(NEXT_N=key.next_n, NEXT_N_POW2=wg.triton_next_pow2(key.next_n), HEADS=key.heads,
                    KV_BLOCK_SIZE=key.kv_block_size, CHUNK=k["ChunkK"],
                    ROWS_PER_MMA=wg.rows_per_mma(problem, k["RowsPerMMA"]), LENS_2D=problem.lens_2d,
                    BALANCED=k["Schedule"] == common.BALANCED, HEAD_SUM=int(k["HeadSum"] == "tensor"))

    def call_constexprs(self, args: LaunchArgs) -> dict:
        return {}  # plain loads: no alignment path

    def call_parts(self, args: LaunchArgs, plan) -> tuple[tuple, dict]:
        q_scale = args.q_scale
        return (q_scale, q_scale.stride(0), q_scale.stride(1)), {}

    def plan(self, args: LaunchArgs, config: dict) -> tuple[tuple, int, dict]:
        p = args.problem
        kwargs = {**self.constexprs(p, config), **self.options(p, config)}
        compiled = None
        if kwargs["BALANCED"]:  # the grid follows the compiled kernel's occupancy (compiled here once)
            try:
                compiled = self.kernel.warmup(*common.kernel_arguments(args, 1), *self.call_parts(args, None)[0],
                                              grid=(1,), **kwargs)
            except Exception:  # no loaded kernel to ask (a stand-in driver): the estimate sizes the grid
                compiled = None
        return (*self.grid(p, config, compiled), kwargs)

    # ------------------------------------------------------------------------- compile specs
    def spec_problem(self, arch: str, cfg: dict) -> Problem:
        problem = common.problem_for(arch, self.fp8[arch], cfg)
        key = problem.shape_key
        return dataclasses.replace(problem, shape_key=dataclasses.replace(problem.shape_key, kv_format="fp4"))

    def spec_arguments(self, problem: Problem, cfg: dict) -> tuple[tuple, dict, dict]:
        """A typical vLLM call: packed uint8 q rows, a packed fp4 cache, contiguous exponents."""
        runtime = list(common.typical_arguments(problem))
        key = problem.shape_key
        b, n, h = key.batch, key.next_n, key.heads
        block_bytes = key.kv_block_size * (HEAD_DIM // 2 + 4)
        runtime[0] = StandIn(torch.uint8, b * n * h * HEAD_DIM // 2)
        runtime[1] = StandIn(torch.uint8, runtime[1].ptr_range())
        runtime[7:11] = [n * h * HEAD_DIM // 2, h * HEAD_DIM // 2, HEAD_DIM // 2, block_bytes]
        runtime[20] = (1 << 30) // block_bytes
        q_scale = (StandIn(torch.int32, b * n * h * 4), n * h, h)
        return tuple(runtime) + q_scale, self.constexprs(problem, cfg), {}

    def kernel_key(self, problem: Problem, cfg: dict) -> tuple:
        return tuple(sorted(self.constexprs(problem, cfg).items()))

    def compile_matrix(self, arch: str) -> list[dict]:
        """Every candidate and the default of H 32/64 x next_n 1/2/3/4 x KVBlockSize 32/64 (plain
        cache, 2-D lengths), and the default with bf16 logits, deduplicated by kernel; the default
        of H 64, next_n 2 at KVBlockSize 1, 16, 128, 256."""
        out = common.deduplicated_matrix(self, arch)
        for kv_block_size in (1, 16, 128, 256):  # the other block sizes: the default of one shape each
            fields = {"heads": 64, "next_n": 2, "kv_block_size": kv_block_size, "preshuffle": False, "lens_2d": True}
            out.append(dict(fields, **self.default_config(self.spec_problem(arch, fields))))
        return out

VARIANT = Fp4WgmmaVariant()
