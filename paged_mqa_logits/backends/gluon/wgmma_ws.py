"""Host side of the sm_90 warp-specialised ``wgmma_ws`` variant (its kernel:
``kernels/wgmma_ws.py``): the register split between the consumer and producer warpgroups, the
resource rules, the TMA key box and descriptor, the knobs and candidates and the launch plan.

Knobs: ``wgmma``'s ``ChunkK`` (64/128), ``RowsPerMMA``, ``num_stages`` and
``CtasPerSM`` (1-3: the register split and shared memory are sized for exactly that many), less
``SplitKV`` (the balanced schedule only); plus ``Consumers`` (1-4 consumer warpgroups per
program), ``RowSplit`` (1: a consumer scores whole tiles; 2: consumers pair up on each tile, each
holding half its row groups, see :func:`fits`) and ``KeyCopy`` (``gather``: cp.async; ``tma``:
one TMA box per cache block where the call's cache allows it, see :func:`key_box`) and ``HeadSum``
(``fp32``; ``tensor``: the head sum on the tensor cores, as ``wgmma_pipes`` runs it, see
:func:`tensor_fits`).
"""

from __future__ import annotations

import torch

from ...arch import lds_limit
from ...problem import LaunchArgs, Problem
from ...schedule import persistent_programs
from ...triton_internals.gluon_api import TensorDescriptor
from . import common
from . import wgmma as wg
from .kernels.wgmma import HEAD_DIM
from .kernels.wgmma_ws import KEY_BOX_LAYOUT, NUM_WARPS, PRODUCER_WARPS, wgmma_ws_logits_kernel
from .variant import LaunchPlan

#: producer registers per thread: tile addresses, the prefetched block ids, loop state
PRODUCER_REGS = {64: 56, 128: 88}
#: registers a ``RowSplit`` consumer needs beside its live accumulators (see :func:`fits`)
SPLIT_CONSUMER_OVERHEAD = 40
#: consumer counts whose ``KeyCopy=tma`` programs faulted on the H200 (docs/PERF_NOTES.md)
TMA_REFUSED_CONSUMERS = (3,)


def max_registers(ctas: int, consumers: int = 1) -> int:
    """``maxnreg`` for ``ctas`` programs of ``consumers`` consumer warpgroups and one producer
    warpgroup per SM (a multiple of 8)."""
    threads = (consumers * NUM_WARPS + PRODUCER_WARPS) * 32
    return min(256, wg.SM_REGISTERS // (ctas * threads) // 8 * 8)


def consumer_registers(chunk: int, ctas: int, consumers: int = 1) -> int:
    """What ``setmaxnreg`` gives each consumer warpgroup: the program's registers less the
    producer's, shared equally (a multiple of 8, at most 256)."""
    pool = (consumers + 1) * max_registers(ctas, consumers) - PRODUCER_REGS[chunk]
    return min(256, pool // consumers // 8 * 8)


def shared_bytes(problem: Problem, chunk: int, stages: int, consumers: int, rows: int = 1, split: int = 1,
                 head_sum: str = "fp32") -> int:
    """The ring, one Q/weights/limits set per consumer, a full and an empty mbarrier per slot; the
    tensor head sum's weights."""
    pow2 = wg.triton_next_pow2(problem.shape_key.next_n)
    per_consumer = pow2 * problem.shape_key.heads * (HEAD_DIM + 4) + 4 * pow2  # Q and weights rows, limits
    ring = stages * chunk * (HEAD_DIM + 4)
    extra = wg.headsum_bytes(problem, rows, consumers, split) if head_sum == "tensor" else 0
    return ring + consumers * per_consumer + 2 * 8 * stages + extra


#: registers a ``HeadSum=tensor`` consumer needs beside its accumulators, its packed bf16 scores
#: and its head-sum accumulators (addresses, row limits, loop state)
TENSOR_CONSUMER_OVERHEAD = 24


def tensor_fits(problem: Problem, chunk: int, rows: int, stages: int, ctas: int, consumers: int = 1,
                split: int = 1) -> bool:
    """``HeadSum=tensor``: equal row groups (one weights buffer shape), at most two per consumer
    (ptxas spills four); every score wgmma of a consumer's groups in flight at once, so all their
    accumulators live together (at most ``wgmma``'s budget), with one group's packed bf16 scores
    (half its accumulator) and each group's head-sum accumulator beside them, within the
    consumer's registers; shared memory for the head-sum weights too."""
    mine = wg.problem_row_groups(problem, rows)[::split]
    if wg.unequal_groups_reason(problem, rows) is not None or len(mine) > 2:
        return False
    accumulators, registers = wg.tensor_head_sum_registers(problem, chunk, mine)
    need = registers + TENSOR_CONSUMER_OVERHEAD
    smem = shared_bytes(problem, chunk, stages, consumers, rows, split, "tensor")
    return (accumulators <= wg.ACC_REG_BUDGET and need <= consumer_registers(chunk, ctas, consumers)
            and smem <= lds_limit("sm_90") and ctas * (smem + 1024) <= wg.SM_SHARED_BYTES)


def consumer_accumulators(problem: Problem, chunk: int, rows: int, split: int) -> int:
    """fp32 accumulator registers per thread live at once in one consumer scoring every
    ``split``-th row group (two consecutive of its groups while one is reduced and the next
    computed, as :func:`wgmma.resources` counts them for all groups)."""
    groups = wg.problem_row_groups(problem, rows)
    return max(wg.live_accumulators(problem, groups[part::split], chunk) for part in range(split))


def fits(problem: Problem, chunk: int, rows: int, stages: int, ctas: int, consumers: int = 1,
         split: int = 1) -> bool:
    """The consumers' accumulators and epilogues fit their registers (``wgmma``'s
    estimate; at most two row groups per consumer: with more, ptxas spills within a consumer's
    share) and ``ctas`` programs' shared memory fits an SM.

    Under 128 registers a consumer scoring whole tiles holds 64-token tiles of at most 64
    columns only; one of ``split`` > 1 consumers per tile, which holds only its own row groups,
    needs :data:`SPLIT_CONSUMER_OVERHEAD` registers beside its accumulators (ptxas: 104 hold a
    128-column group of a 64-token tile without spilling, 88 do not; 96 spill a 128-token tile's)."""
    r = wg.resources(problem, chunk, rows, stages)
    smem = shared_bytes(problem, chunk, stages, consumers)
    groups = wg.problem_row_groups(problem, rows)
    mine = groups[::split]  # the first part's groups: the most of any part
    regs = consumer_registers(chunk, ctas, consumers)
    acc = consumer_accumulators(problem, chunk, rows, split)
    if split > 1:
        if acc + SPLIT_CONSUMER_OVERHEAD > regs:
            return False
    elif regs < 128 and (chunk != 64 or max(n for _, n in groups) * problem.shape_key.heads > 64):
        return False
    estimate = r["regs_estimate"] - r["acc_regs"] + acc
    return (len(mine) <= 2 and acc <= r["acc_budget"] and (regs < 128 or estimate <= regs)
            and smem <= lds_limit("sm_90") and ctas * (smem + 1024) <= wg.SM_SHARED_BYTES)


def key_box(problem: Problem, key_copy: str, chunk: int, kv_align: int) -> int:
    """Tokens per TMA box of the keys (``KeyCopy=tma``), 0 for the cp.async gather: TMA needs
    a 16-byte aligned cache base and block stride and token-major keys (not preshuffled), and
    a box of at least one 8-row swizzle atom."""
    key = problem.shape_key
    if key_copy != "tma" or key.preshuffle or kv_align != 16 or key.kv_block_size < 8:
        return 0
    return min(key.kv_block_size, chunk)


def key_descriptor(kv_cache, box: int):
    """A TMA descriptor over the keys of ``kv_cache`` (``[num_blocks, KV_BLOCK_SIZE, 1, D + 4]``
    uint8): ``[num_blocks, KV_BLOCK_SIZE, D]`` fp8 with the cache's block stride, boxes of
    ``[1, box, D]`` (zero-filled past the cache: no box reads outside it)."""
    num_blocks, kv_block_size = kv_cache.shape[0], kv_cache.shape[1]
    keys = kv_cache.view(torch.float8_e4m3fn)
    shape, strides = [num_blocks, kv_block_size, HEAD_DIM], [kv_cache.stride(0), HEAD_DIM, 1]
    view = torch.as_strided(keys, shape, strides, keys.storage_offset())
    return TensorDescriptor(view, shape, strides, [1, box, HEAD_DIM], KEY_BOX_LAYOUT)


#: ring depths of the multi-consumer programs: one program per SM keeps every tile in flight
MULTI_CONSUMER_STAGES = {64: 8, 128: 4}


class WgmmaWsVariant(wg.WgmmaVariant):
    """``wgmma``'s knobs less ``SplitKV`` (balanced only), 1-3 programs per SM, 1-4 consumer
    warpgroups per program, one or two of them per tile, keys by cp.async gather or TMA; its
    kernel."""

    name = "wgmma_ws"
    knob_space = {"ChunkK": (64, 128), "RowsPerMMA": (1, 2, 4, 8), "num_stages": range(2, 9),
                  "CtasPerSM": (1, 2, 3), "Consumers": (1, 2, 3, 4), "RowSplit": (1, 2), "KeyCopy": ("gather", "tma"),
                  "HeadSum": common.HEAD_SUMS, "num_warps": (NUM_WARPS,), "Schedule": (common.BALANCED,)}
    kernel = wgmma_ws_logits_kernel

    def knobs(self, problem: Problem, config: dict) -> dict:
        """Unset knobs take the default config's values (``Consumers`` 1, ``KeyCopy`` gather)."""
        tile, default = self.tile_knobs(problem, config,
                                        default_keys=("ChunkK", "RowsPerMMA", "num_stages", "CtasPerSM"))
        ctas = int(config.get("CtasPerSM") or default["CtasPerSM"])
        self.require_in("CtasPerSM", ctas, self.knob_space["CtasPerSM"])
        consumers = int(config.get("Consumers") or 1)
        self.require_in("Consumers", consumers, self.knob_space["Consumers"])
        split = int(config.get("RowSplit") or 1)
        self.require_in("RowSplit", split, self.knob_space["RowSplit"])
        self.require(consumers % split == 0, "RowSplit", split, f"a divisor of Consumers={consumers}")
        key_copy = config.get("KeyCopy") or "gather"
        self.require_in("KeyCopy", key_copy, self.knob_space["KeyCopy"])
        self.require(not (key_copy == "tma" and consumers in TMA_REFUSED_CONSUMERS), "KeyCopy", key_copy,
                     f"gather with Consumers={consumers} (TMA with {consumers} consumers faulted on the H200, "
                     f"see docs/PERF_NOTES.md)")
        schedule = config.get("Schedule") or common.BALANCED
        self.require(schedule == common.BALANCED, "Schedule", schedule,
                     f"{common.BALANCED} (the warp-specialised kernel runs the balanced schedule only)")
        head_sum = config.get("HeadSum") or common.HEAD_SUMS[0]
        self.require_in("HeadSum", head_sum, self.knob_space["HeadSum"])
        if head_sum == "tensor":
            reason = wg.unequal_groups_reason(problem, tile["RowsPerMMA"])
            self.require(reason is None, "HeadSum", head_sum, reason)
        return {**tile, "CtasPerSM": ctas, "Consumers": consumers, "RowSplit": split, "KeyCopy": key_copy,
                "HeadSum": head_sum, "num_warps": NUM_WARPS, "Schedule": schedule}

    def admits(self, problem: Problem, config: dict) -> bool:
        k = self.knobs(problem, config)
        rule = tensor_fits if k["HeadSum"] == "tensor" else fits
        return rule(problem, k["ChunkK"], k["RowsPerMMA"], k["num_stages"], k["CtasPerSM"], k["Consumers"],
                    k["RowSplit"])

    def shape_reason(self, problem: Problem) -> str | None:
        reason = super().shape_reason(problem)
        if reason is None and not self.candidates(problem):
            reason = f"no warp-specialised configuration fits sm_90's registers and shared memory for " \
                     f"{problem.describe()}"
        return reason

    @staticmethod
    def _setting(chunk: int, rows: int, stages: int, ctas: int, consumers: int = 1, key_copy: str = "gather",
                 split: int = 1, head_sum: str = "fp32") -> dict:
        return {"ChunkK": chunk, "RowsPerMMA": rows, "num_stages": stages, "CtasPerSM": ctas, "Consumers": consumers,
                "RowSplit": split, "KeyCopy": key_copy, "HeadSum": head_sum, "num_warps": NUM_WARPS,
                "Schedule": common.BALANCED}

    def candidate_groups(self, problem: Problem):
        """Per row grouping (the two widest that fit): ChunkK 64/128 x a shallow and a deep ring at
        two programs per SM (one program of one consumer leaves the tensor cores idle during its
        epilogue); three programs per SM where the consumer fits 104 registers; and one program
        per SM with two or three consumer warpgroups sharing its producer and ring, which leaves
        each consumer more registers than as many single-consumer programs would (152 against
        104 for three). Where a tile has several row groups, ``RowSplit=2``: two consumers per
        tile, each holding half the groups' accumulators, as two programs of two consumers or one
        of four (four consumers per SM where whole-tile consumers fit two). Where the cache allows
        TMA (see :func:`key_box`), each setting again with ``KeyCopy=tma`` (but for the consumer
        counts in :data:`TMA_REFUSED_CONSUMERS`): one producer thread then moves a tile that the
        gather spreads over a warpgroup, which is what lets one producer feed several consumers.
        At next_n >= 2, after every fp32 setting (so the default stays fp32 until a table row names
        tensor), each setting again with ``HeadSum=tensor`` where :func:`tensor_fits` admits it."""
        settings, groupings = [], 0
        for rows in wg.rows_options(problem):
            fitting = [(chunk, stages) for chunk in (64, 128) for stages in wg.stages_for(chunk)
                       if fits(problem, chunk, rows, stages, 2)]
            settings += [self._setting(chunk, rows, stages, 2) for chunk, stages in fitting]
            settings += [self._setting(64, rows, stages, 3) for stages in wg.stages_for(64)]
            settings += [self._setting(chunk, rows, stages, 1, consumers) for consumers in (2, 3)
                         for chunk, stages in MULTI_CONSUMER_STAGES.items()]
            if len(wg.problem_row_groups(problem, rows)) > 1:
                settings += [self._setting(64, rows, 4, 2, 2, split=2),
                             self._setting(64, rows, MULTI_CONSUMER_STAGES[64], 1, 4, split=2)]
            groupings += bool(fitting)
            if groupings == 2:
                break
        if key_box(problem, "tma", 64, 16 if problem.kv_aligned16 else 4):
            settings += [dict(setting, KeyCopy="tma") for setting in settings
                         if setting["Consumers"] not in TMA_REFUSED_CONSUMERS]
        for setting in settings:
            yield [setting]
        if problem.shape_key.next_n >= 2:
            for setting in settings:
                if wg.unequal_groups_reason(problem, setting["RowsPerMMA"]) is not None:
                    continue
                tensor = dict(setting, HeadSum="tensor")
                if self.admits(problem, tensor):
                    yield [tensor]

    def default_config(self, problem: Problem) -> dict:
        """The widest row grouping that fits two programs per SM, 64-token tiles, the deep ring;
        else (more row groups than whole-tile consumers hold) four consumers, two per tile."""
        for rows in wg.rows_options(problem):
            for chunk in (64, 128):
                for stages in reversed(wg.stages_for(chunk)):
                    for ctas in (2, 1):
                        if fits(problem, chunk, rows, stages, ctas):
                            return {"variant": self.name, **self._setting(chunk, rows, stages, ctas)}
        for rows in wg.rows_options(problem):
            split = self._setting(64, rows, MULTI_CONSUMER_STAGES[64], 1, 4, split=2)
            if len(wg.problem_row_groups(problem, rows)) > 1 and self.admits(problem, split):
                return {"variant": self.name, **split}
        raise ValueError(f"{self.owner}: no configuration fits {problem.describe()}")

    def constexprs(self, problem: Problem, config: dict) -> dict:
        k = self.knobs(problem, config)
        key = problem.shape_key
        return dict(NEXT_N=key.next_n, NEXT_N_POW2=wg.triton_next_pow2(key.next_n), HEADS=key.heads,
                    KV_BLOCK_SIZE=key.kv_block_size, CHUNK=k["ChunkK"],
                    ROWS_PER_MMA=wg.rows_per_mma(problem, k["RowsPerMMA"]), STAGES=k["num_stages"],
                    PRESHUFFLE=key.preshuffle, LENS_2D=problem.lens_2d, PRODUCER_REGS=PRODUCER_REGS[k["ChunkK"]],
                    CONSUMERS=k["Consumers"], CONSUMER_REGS=consumer_registers(k["ChunkK"], k["CtasPerSM"],
                                                                               k["Consumers"]),
                    ROW_SPLIT=k["RowSplit"], HEAD_SUM=int(k["HeadSum"] == "tensor"))

    def options(self, problem: Problem, config: dict) -> dict:
        k = self.knobs(problem, config)
        return {"num_warps": NUM_WARPS, "maxnreg": max_registers(k["CtasPerSM"], k["Consumers"])}

    def grid(self, problem: Problem, config: dict, compiled=None) -> tuple[int, int]:
        """One persistent wave: ``CtasPerSM`` programs per SM (registers and shared memory are sized
        for exactly that many, see :func:`max_registers` and :func:`fits`)."""
        ctas = self.knobs(problem, config)["CtasPerSM"]
        return persistent_programs(problem.cu_num or wg.SM_COUNT_H100, ctas), 1

    def plan(self, args: LaunchArgs, config: dict) -> LaunchPlan:
        """One persistent wave; its ``call_inputs``: the ``KEY_BOX`` of a call per ``KV_ALIGN``
        (:func:`key_box` of the config's ``KeyCopy`` and ``ChunkK``), so a launch resolves no knob."""
        p = args.problem
        k = self.knobs(p, config)
        boxes = {kv_align: key_box(p, k["KeyCopy"], k["ChunkK"], kv_align) for kv_align in wg.KV_ALIGNS}
        return LaunchPlan(self.grid(p, config), 1, {**self.constexprs(p, config), **self.options(p, config)}, boxes)

    def call_parts(self, args: LaunchArgs, plan: LaunchPlan) -> tuple[tuple, dict]:
        """The key descriptor (or ``None``) after the common arguments, the alignment and
        ``KEY_BOX`` constexprs: whether a ``KeyCopy=tma`` config moves keys by TMA depends on
        each call's cache address and stride (and a cache of no blocks gathers), and the
        descriptor holds the cache's address and block count."""
        aligned = self.call_constexprs(args)
        box = plan.call_inputs[aligned["KV_ALIGN"]] if args.num_blocks > 0 else 0
        return (key_descriptor(args.kv_cache, box) if box else None,), {**aligned, "KEY_BOX": box}

    def spec_arguments(self, problem: Problem, cfg: dict) -> tuple[tuple, dict, dict]:
        """``wgmma``'s typical call, plus the key descriptor over a small host cache of the
        typical block layout where the config moves keys by TMA."""
        runtime, consts, path = super().spec_arguments(problem, cfg)
        k = self.knobs(problem, cfg)
        box = key_box(problem, k["KeyCopy"], k["ChunkK"], consts["KV_ALIGN"])
        cache = torch.empty((2, problem.shape_key.kv_block_size, 1, HEAD_DIM + 4), dtype=torch.uint8)
        return runtime + (key_descriptor(cache, box) if box else None,), {**consts, "KEY_BOX": box}, path

    def kernel_key(self, problem: Problem, cfg: dict) -> tuple:
        k = self.knobs(problem, cfg)
        return tuple(sorted(self.constexprs(problem, cfg).items())), k["CtasPerSM"], k["KeyCopy"]

    def matrix_candidates(self, problem: Problem) -> list[dict]:
        return self.candidates(problem)


VARIANT = WgmmaWsVariant()
