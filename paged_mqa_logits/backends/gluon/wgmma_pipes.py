"""Host side of the sm_90 ``wgmma_pipes`` variant (its kernel: ``kernels/wgmma_pipes.py``): the
knobs, the register split between consumer warpgroups and producer warps, the resource rules,
the TMA descriptors, the candidates and the launch plan.

Knobs: ``Consumers`` (1-4 consumer warpgroups per program), ``RowSplit`` (1: a consumer scores
whole tiles; 2: consumers pair up on each tile, each scoring every other row group),
``RowsPerMMA`` (next_n rows per wgmma), ``num_stages`` (ring slots per team), ``CtasPerSM``
(programs per SM the register split and the persistent grid are sized for), ``KeyCopy``
(``tma``: one TMA box per cache block where the call's cache allows it, see :func:`key_box`;
``gather``: cp.async), ``Overlap`` (1: a consumer issues a tile's wgmmas before the previous
tile's epilogue, holding two tiles' accumulators), ``HeadSum`` (``fp32``: the weighted ReLU head
sum in fp32 instructions, two per score; ``tensor``: the scores ReLU'd and rounded to bf16 in one
instruction per two, then summed over the heads by a second, small bf16 wgmma against the
weights split into a high and a low bf16 part; see docs/CONTRACT.md for its error bound),
``Schedule`` and ``SplitKV`` (as ``wgmma``'s). Tiles are 64 tokens (``ChunkK`` 64, one wgmma's M).
The kernel writes ``clean_logits``' ``-inf`` itself.
"""

from __future__ import annotations

import torch

from ...arch import lds_limit
from ...problem import LaunchArgs, Problem
from ...schedule import persistent_programs
from ...triton_internals.gluon_api import TensorDescriptor
from ..base import MAX_SPLIT_KV
from . import common
from . import wgmma as wg
from .kernels.wgmma_pipes import (CONSUMER_WARPS, HEAD_DIM, KEY_BOX_LAYOUT, PRODUCER_WARPS, SCALE_BOX_LAYOUT, TILE,
                                   wgmma_pipes_logits_kernel)
from .kernels.wgmma import headsum_columns
from .variant import GluonVariant, LaunchPlan

#: registers per thread of a producer warp (its warpgroup's ``setmaxnreg``): a TMA warp holds a
#: tile's block ids and the walk's state (24 keep its tile loop free of local memory, and leave
#: the default-partition consumer 120), a gathering warp the addresses of its 16 cp.async per tile
PRODUCER_REGS = {"tma": 24, "gather": 56}
#: registers a consumer needs beside its accumulators and weights (addresses, limits, loop state,
#: the epilogue's partial sums), and what ptxas wants on top for each further row group in flight,
#: for rows masked past a next_n that is not a power of two, and for a split-schedule consumer
#: pair; calibrated so that no candidate's tile loop touches local memory
#: (tests/backends/gluon/test_compile_wgmma_pipes.py compiles every candidate)
CONSUMER_OVERHEAD = 16
EXTRA_GROUP_REGS = 32
UNEVEN_ROWS_REGS = 8
SPLIT_PAIR_REGS = 8


def teams(consumers: int, split: int) -> int:
    return consumers // split


def program_warps(consumers: int, split: int) -> int:
    """Warps of one program: the consumer warpgroups, and the producer warps padded to whole
    warpgroups (``setmaxnreg`` works per warpgroup)."""
    producer_groups = -(-teams(consumers, split) * PRODUCER_WARPS // 4)
    return CONSUMER_WARPS * consumers + 4 * producer_groups


def max_registers(ctas: int, consumers: int, split: int) -> int:
    """``maxnreg`` for ``ctas`` programs per SM (a multiple of 8)."""
    return min(256, wg.SM_REGISTERS // (ctas * program_warps(consumers, split) * 32) // 8 * 8)


def register_split(ctas: int, consumers: int, split: int, key_copy: str) -> tuple[int, int]:
    """``(consumer, producer)`` registers per thread (``setmaxnreg``, multiples of 8, at most
    256) of a program whose keys arrive by ``key_copy``: the program's registers less the
    producer warpgroups' :data:`PRODUCER_REGS`, shared equally by the consumers (Triton gives
    the default partition, consumer 0, what the rounding leaves)."""
    producer_groups = program_warps(consumers, split) // 4 - consumers
    pool = (consumers + producer_groups) * max_registers(ctas, consumers, split)
    consumer = min(256, (pool - producer_groups * PRODUCER_REGS[key_copy]) // consumers // 8 * 8)
    return consumer, PRODUCER_REGS[key_copy]


def consumer_registers(ctas: int, consumers: int, split: int, key_copy: str) -> int:
    return register_split(ctas, consumers, split, key_copy)[0]


def call_registers(knobs: dict, box: int) -> dict:
    """The register split of a call: by TMA when its cache takes TMA boxes (``box > 0``), else
    by gather, whatever ``KeyCopy`` asked for (a TMA config on an unaligned cache gathers)."""
    consumer, producer = register_split(knobs["CtasPerSM"], knobs["Consumers"], knobs["RowSplit"],
                                        knobs["KeyCopy"])
    return {"CONSUMER_REGS": consumer, "PRODUCER_REGS": producer}


def consumer_groups(problem: Problem, rows: int, split: int, part: int = 0) -> tuple:
    """``(first_row, rows)`` of the row groups consumer part ``part`` of a team scores."""
    return wg.problem_row_groups(problem, rows)[part::split]


def consumer_need(problem: Problem, rows: int, split: int, schedule: str, overlap: int = 0,
                  head_sum: str = "fp32") -> int:
    """Registers per thread a consumer needs: every accumulator of its groups at once (its
    wgmmas are all issued before the first is waited for; with ``overlap``, two tiles' worth),
    their weights (``HeadSum=tensor``: as many for the packed bf16 scores, plus each group's
    head-sum accumulator), and the overheads."""
    groups = consumer_groups(problem, rows, split)
    key = problem.shape_key
    columns = sum(r * key.heads for _, r in groups)
    need = (columns // 2 * (1 + overlap) + columns // 4 + CONSUMER_OVERHEAD
            + EXTRA_GROUP_REGS * max(len(groups) - 1, 0))
    if head_sum == "tensor":
        need += sum(TILE * headsum_columns(r) // (32 * CONSUMER_WARPS) for _, r in groups)
    if key.next_n & (key.next_n - 1):
        need += UNEVEN_ROWS_REGS
    if split > 1 and schedule == common.SPLIT:
        need += SPLIT_PAIR_REGS
    return need


def shared_bytes(problem: Problem, stages: int, consumers: int, split: int, rows: int = 1,
                 head_sum: str = "fp32") -> int:
    """Per team a ring of key and scale slots with its two barriers per slot; a two-stage ring
    of Q rows and weights; the tensor head sum's weights."""
    q_rows = wg.triton_next_pow2(problem.shape_key.next_n) * problem.shape_key.heads
    ring = teams(consumers, split) * stages * (TILE * (HEAD_DIM + 4) + 16)
    extra = wg.headsum_bytes(problem, rows, consumers, split) if head_sum == "tensor" else 0
    return ring + 2 * (q_rows * (HEAD_DIM + 4) + 16) + extra


def headsum_reason(problem: Problem, rows: int, overlap: int) -> str | None:
    """Why ``HeadSum=tensor`` cannot run a config (None if it can): its head-sum wgmmas are
    waited for in issue order, so they cannot run behind an overlapped tile's score wgmmas, and
    one weights buffer shape serves a consumer, so its row groups must be equal."""
    if overlap:
        return "Overlap=0 (the head-sum wgmmas would wait for the next tile's)"
    return wg.unequal_groups_reason(problem, rows)


#: registers ptxas wants beside a wgmma's accumulators under the kernel-wide ``maxnreg`` (it
#: refuses to compile, "insufficient registers", below; ``setmaxnreg`` does not lift it)
WGMMA_OPERAND_REGS = 26


def fits(problem: Problem, rows: int, stages: int, consumers: int, split: int, ctas: int, key_copy: str,
         schedule: str = common.BALANCED, overlap: int = 0, head_sum: str = "fp32") -> bool:
    """Every consumer part has a row group (a config with more parts than groups runs, its
    spare consumers freeing their slots unscored, but is never worth proposing), exactly one
    when overlapped; the
    consumers' registers and ``ctas`` programs' shared memory fit an SM; the widest wgmma
    compiles under the program's ``maxnreg``."""
    groups = wg.problem_row_groups(problem, rows)
    if len(groups) < split:
        return False
    if overlap and len(consumer_groups(problem, rows, split)) != 1:
        # a part with several row groups already runs one group's epilogue under the next
        # group's wgmma; overlapped tiles on top of that spill (ptxas, 32 heads x next_n 3)
        return False
    widest = max(r for _, r in groups) * problem.shape_key.heads
    smem = shared_bytes(problem, stages, consumers, split, rows, head_sum)
    return (consumer_need(problem, rows, split, schedule, overlap, head_sum)
            <= consumer_registers(ctas, consumers, split, key_copy)
            and widest // 2 * (1 + overlap) + WGMMA_OPERAND_REGS <= max_registers(ctas, consumers, split)
            and smem <= lds_limit("sm_90") and ctas * (smem + 1024) <= wg.SM_SHARED_BYTES)


#: the fewest tokens per cache block TMA moves: a box lands at a 128-byte aligned shared
#: address, and a block's scales are 4 bytes per token
MIN_TMA_BLOCK = 32


def key_box(problem: Problem, key_copy: str, kv_align: int) -> int:
    """Tokens per TMA box (``KeyCopy=tma``), 0 for the cp.async gather: TMA needs a 16-byte
    aligned cache base and block stride, token-major keys (not preshuffled), and blocks of at
    least :data:`MIN_TMA_BLOCK` tokens (a tile takes one or two boxes of each kind)."""
    key = problem.shape_key
    if key_copy != "tma" or key.preshuffle or kv_align != 16 or key.kv_block_size < MIN_TMA_BLOCK:
        return 0
    return min(key.kv_block_size, TILE)


def descriptors(kv_cache, box: int) -> tuple:
    """TMA descriptors over ``kv_cache`` (``[num_blocks, KV_BLOCK_SIZE, 1, D + 4]`` uint8): the keys as
    ``[num_blocks, KV_BLOCK_SIZE, D]`` fp8 (boxes ``[1, box, D]``) and the block rows as fp32
    ``[num_blocks, stride / 4]`` (boxes ``[1, box]`` of scales), both with the cache's block
    stride; boxes past the cache are zero-filled, so none reads outside it."""
    num_blocks, kv_block_size = kv_cache.shape[0], kv_cache.shape[1]
    keys = kv_cache.view(torch.float8_e4m3fn)
    shape, strides = [num_blocks, kv_block_size, HEAD_DIM], [kv_cache.stride(0), HEAD_DIM, 1]
    key_view = torch.as_strided(keys, shape, strides, keys.storage_offset())
    words = kv_cache.view(torch.float32)
    row_words = kv_cache.stride(0) // 4
    scale_view = torch.as_strided(words, [num_blocks, row_words], [row_words, 1], words.storage_offset())
    return (TensorDescriptor(key_view, shape, strides, [1, box, HEAD_DIM], KEY_BOX_LAYOUT),
            TensorDescriptor(scale_view, [num_blocks, row_words], [row_words, 1], [1, box], SCALE_BOX_LAYOUT))


class WgmmaPipesVariant(GluonVariant):
    """Consumer warpgroups in teams, one producer warp and one ring per team (see the kernel)."""

    name = "wgmma_pipes"
    archs = ("sm_90",)
    knob_space = {"ChunkK": (TILE,), "RowsPerMMA": (1, 2, 4, 8), "num_stages": range(2, 9),
                  "Consumers": (1, 2, 3, 4), "RowSplit": (1, 2), "CtasPerSM": (1, 2), "KeyCopy": ("gather", "tma"),
                  "Overlap": (0, 1), "HeadSum": common.HEAD_SUMS,
                  "Schedule": common.SCHEDULES, "SplitKV": range(0, MAX_SPLIT_KV + 1), "num_warps": (CONSUMER_WARPS,)}
    kernel = wgmma_pipes_logits_kernel
    cleans_logits = True

    # ------------------------------------------------------------------------- knobs
    def knobs(self, problem: Problem, config: dict) -> dict:
        """Unset knobs take the default config's values (``Schedule``: ``common.default_schedule``)."""
        default = self.default_config(problem) if any(
            config.get(k) is None for k in ("RowsPerMMA", "num_stages", "Consumers", "CtasPerSM")) else {}
        pick = {k: config.get(k) if config.get(k) is not None else default.get(k)
                for k in ("RowsPerMMA", "num_stages", "Consumers", "RowSplit", "CtasPerSM", "KeyCopy")}
        chunk = int(config.get("ChunkK") or TILE)
        self.require_in("ChunkK", chunk, self.knob_space["ChunkK"])
        rows = int(pick["RowsPerMMA"])
        self.require(rows >= 1 and not rows & (rows - 1), "RowsPerMMA", rows, "a power of two")
        self.require(rows * problem.shape_key.heads <= wg.MAX_MMA_N, "RowsPerMMA", rows,
                     f"RowsPerMMA x heads <= {wg.MAX_MMA_N} (wgmma's largest N), "
                     f"got {rows} x {problem.shape_key.heads} heads")
        stages = int(pick["num_stages"])
        self.require_in("num_stages", stages, self.knob_space["num_stages"])
        consumers = int(pick["Consumers"])
        self.require_in("Consumers", consumers, self.knob_space["Consumers"])
        split = int(pick["RowSplit"] or 1)
        self.require_in("RowSplit", split, self.knob_space["RowSplit"])
        self.require(consumers % split == 0, "RowSplit", split, f"a divisor of Consumers={consumers}")
        ctas = int(pick["CtasPerSM"])
        self.require_in("CtasPerSM", ctas, self.knob_space["CtasPerSM"])
        key_copy = pick["KeyCopy"] or "tma"
        self.require_in("KeyCopy", key_copy, self.knob_space["KeyCopy"])
        overlap = int(config.get("Overlap") or 0)
        self.require_in("Overlap", overlap, self.knob_space["Overlap"])
        head_sum = config.get("HeadSum") or "fp32"
        self.require_in("HeadSum", head_sum, self.knob_space["HeadSum"])
        if head_sum == "tensor":
            reason = headsum_reason(problem, rows, overlap)
            self.require(reason is None, "HeadSum", head_sum, reason)
        splits = int(config.get("SplitKV") or 0)
        self.require(splits >= 0, "SplitKV", splits, "an integer >= 0")
        warps = int(config.get("num_warps") or CONSUMER_WARPS)
        self.require(warps == CONSUMER_WARPS, "num_warps", warps, f"{CONSUMER_WARPS} (a consumer warpgroup)")
        return {"ChunkK": chunk, "RowsPerMMA": rows, "num_stages": stages, "Consumers": consumers, "RowSplit": split,
                "CtasPerSM": ctas, "KeyCopy": key_copy, "Overlap": overlap, "HeadSum": head_sum, "SplitKV": splits,
                "num_warps": CONSUMER_WARPS, "Schedule": self.schedule(problem, config)}

    def admits(self, problem: Problem, config: dict) -> bool:
        k = self.knobs(problem, config)
        return fits(problem, k["RowsPerMMA"], k["num_stages"], k["Consumers"], k["RowSplit"], k["CtasPerSM"],
                    k["KeyCopy"], k["Schedule"], k["Overlap"], k["HeadSum"])

    def shape_reason(self, problem: Problem) -> str | None:
        if problem.shape_key.heads > wg.MAX_MMA_N:
            return (f"heads must be <= {wg.MAX_MMA_N} (one wgmma N covers all heads of a row), "
                    f"got {problem.shape_key.heads}")
        if not self.candidates(problem):
            return f"no configuration of consumer teams fits sm_90's registers and shared memory for " \
                   f"{problem.describe()}"
        return None

    # ------------------------------------------------------------------------- candidates
    @staticmethod
    def _setting(rows: int, stages: int, consumers: int, split: int, ctas: int, key_copy: str, schedule: str,
                 overlap: int = 0, head_sum: str = "fp32") -> dict:
        return {"ChunkK": TILE, "RowsPerMMA": rows, "num_stages": stages, "Consumers": consumers, "RowSplit": split,
                "CtasPerSM": ctas, "KeyCopy": key_copy, "Overlap": overlap, "HeadSum": head_sum, "SplitKV": 0,
                "num_warps": CONSUMER_WARPS, "Schedule": schedule}

    #: (Consumers, RowSplit, CtasPerSM, ring depths, Overlap): four 112-register consumers per SM
    #: in one program, with whole tiles or in pairs; three or two in one program (more registers
    #: each); one per program, two programs per SM; and the overlapped consumers, whose second
    #: set of accumulators needs the registers of fewer consumers (four only for narrow tiles)
    TEAM_SHAPES = ((4, 1, 1, (2, 3, 4), 0), (4, 2, 1, (3, 4, 6), 0), (3, 1, 1, (3, 4), 0), (2, 1, 1, (4, 6), 0),
                   (2, 2, 1, (4, 6), 0), (1, 1, 2, (4, 6), 0),
                   (4, 1, 1, (3, 4), 1), (3, 1, 1, (3, 4), 1), (2, 1, 1, (3, 4, 6), 1), (2, 2, 1, (4, 6), 1))

    def candidate_groups(self, problem: Problem):
        """Per team shape, ring depth and schedule, the widest row grouping that fits; keys by
        TMA where the cache layout allows (see :func:`key_box`), else by gather."""
        key_copy = "tma" if key_box(problem, "tma", 16 if problem.kv_aligned16 else 4) else "gather"
        schedules = (common.BALANCED, common.SPLIT) if problem.shape_key.batch < 64 else (common.BALANCED,)
        for consumers, split, ctas, depths, overlap in self.TEAM_SHAPES:
            for stages in depths:
                for schedule in schedules:
                    yield [self._setting(rows, stages, consumers, split, ctas, key_copy, schedule, overlap)
                           for rows in wg.rows_options(problem)]
        # the same team shapes with the head sum on the tensor cores, after every fp32 one (so
        # the default stays fp32 until a table row names tensor)
        for consumers, split, ctas, depths, overlap in self.TEAM_SHAPES:
            for stages in depths if not overlap else ():
                for schedule in schedules:
                    yield [self._setting(rows, stages, consumers, split, ctas, key_copy, schedule, 0, "tensor")
                           for rows in wg.rows_options(problem) if headsum_reason(problem, rows, 0) is None]

    def default_config(self, problem: Problem) -> dict:
        """The first candidate: four consumers with the widest row grouping that fits whole, else
        in pairs; then the others in candidate order."""
        for group in self.candidate_groups(problem):
            for setting in group:
                setting = dict(setting, Schedule=common.default_schedule(problem))
                if self.admits(problem, setting):
                    return {"variant": self.name, **setting}
        raise ValueError(f"{self.owner}: no configuration fits {problem.describe()}")

    # ------------------------------------------------------------------------- launch plan
    def constexprs(self, problem: Problem, config: dict) -> dict:
        k = self.knobs(problem, config)
        key = problem.shape_key
        return dict(NEXT_N=key.next_n, NEXT_N_POW2=wg.triton_next_pow2(key.next_n), HEADS=key.heads,
                    KV_BLOCK_SIZE=key.kv_block_size, ROWS_PER_MMA=wg.rows_per_mma(problem, k["RowsPerMMA"]),
                    STAGES=k["num_stages"], PRESHUFFLE=key.preshuffle, LENS_2D=problem.lens_2d,
                    BALANCED=k["Schedule"] == common.BALANCED, CONSUMERS=k["Consumers"], ROW_SPLIT=k["RowSplit"],
                    OVERLAP=k["Overlap"], HEAD_SUM=int(k["HeadSum"] == "tensor"))

    def options(self, problem: Problem, config: dict) -> dict:
        k = self.knobs(problem, config)
        return {"num_warps": CONSUMER_WARPS, "maxnreg": max_registers(k["CtasPerSM"], k["Consumers"], k["RowSplit"])}

    def num_splits(self, problem: Problem, config: dict) -> int:
        """``Schedule=split``: programs per sequence (``SplitKV``, or one wave of ``CtasPerSM``
        programs per SM shared out by :func:`wgmma.derive_splits`)."""
        k = self.knobs(problem, config)
        return k["SplitKV"] or wg.derive_splits(problem.cu_num, problem.shape_key.batch, problem.work_context, TILE,
                                                k["CtasPerSM"])

    def grid(self, problem: Problem, config: dict) -> tuple[tuple[int, int], int]:
        """``(grid, num_splits)``: one persistent wave of ``CtasPerSM`` programs per SM (balanced),
        or ``(splits, batch)`` programs (split)."""
        k = self.knobs(problem, config)
        if k["Schedule"] == common.BALANCED:
            return (persistent_programs(problem.cu_num or wg.SM_COUNT_H100, k["CtasPerSM"]), 1), 1
        splits = self.num_splits(problem, config)
        return (splits, problem.shape_key.batch), splits

    def call_constexprs(self, args: LaunchArgs) -> dict:
        return wg.alignment(args.q, args.kv_cache)

    def plan(self, args: LaunchArgs, config: dict) -> LaunchPlan:
        """The grid and constexprs; its ``call_inputs``: the TMA box of a call per ``KV_ALIGN``, and
        the register split per box."""
        p = args.problem
        k = self.knobs(p, config)
        boxes = {kv_align: key_box(p, k["KeyCopy"], kv_align) for kv_align in wg.KV_ALIGNS}
        per_box = {box: call_registers(k, box) for box in (*boxes.values(), 0)}
        grid, splits = self.grid(p, config)
        return LaunchPlan(grid, splits, {**self.constexprs(p, config), **self.options(p, config)}, (boxes, per_box))

    def call_parts(self, args: LaunchArgs, plan: LaunchPlan) -> tuple[tuple, dict]:
        """The descriptors (or ``None``) and the ``clean_logits`` flag after the common arguments;
        the alignment, ``KEY_BOX`` and register-split constexprs (TMA depends on each call's
        cache address and stride, and a cache of no blocks gathers)."""
        aligned = self.call_constexprs(args)
        boxes, per_box = plan.call_inputs
        box = boxes[aligned["KV_ALIGN"]] if args.num_blocks > 0 else 0
        descs = descriptors(args.kv_cache, box) if box else (None, None)
        return (*descs, int(args.clean_logits)), {**aligned, "KEY_BOX": box, **per_box[box]}

    # ------------------------------------------------------------------------- compile specs
    def spec_arguments(self, problem: Problem, cfg: dict) -> tuple[tuple, dict, dict]:
        """``wgmma``'s typical call (``block_stride_pad`` / ``q_misaligned`` select the 4-byte and
        plain-load paths), plus the descriptors over a small host cache of the typical block
        layout where the config moves keys by TMA, and ``clean_logits``."""
        runtime, consts, path = wg.WgmmaVariant.spec_arguments(self, problem, cfg)
        k = self.knobs(problem, cfg)
        box = key_box(problem, k["KeyCopy"], consts["KV_ALIGN"])
        cache = torch.empty((2, problem.shape_key.kv_block_size, 1, HEAD_DIM + 4), dtype=torch.uint8)
        descs = descriptors(cache, box) if box else (None, None)
        return runtime + (*descs, 0), {**consts, "KEY_BOX": box, **call_registers(k, box)}, path

    def kernel_key(self, problem: Problem, cfg: dict) -> tuple:
        k = self.knobs(problem, cfg)
        return tuple(sorted(self.constexprs(problem, cfg).items())), k["CtasPerSM"], k["KeyCopy"]

    def compile_matrix(self, arch: str) -> list[dict]:
        """Every candidate of ``common.representative_problems`` (one per kernel)."""
        return wg.WgmmaVariant.compile_matrix(self, arch)

    def matrix_candidates(self, problem: Problem) -> list[dict]:
        return self.candidates(problem)


VARIANT = WgmmaPipesVariant()
