"""Host side of the sm_90 ``wgmma`` variant (its kernel: ``kernels/wgmma.py``): the resource
rules, the split rule, the knobs and candidates, the launch plan and the compile matrix.

Knobs: ``ChunkK`` (64/128 tokens per tile in the candidates; 256 accepted), ``RowsPerMMA``
(1/2/4/8 next_n rows per wgmma), ``num_stages`` (ring depth, >= 2), ``Schedule`` (``split`` or
``balanced``; unset: ``common.default_schedule``), ``SplitKV`` (split: 0 = derived on the host),
``CtasPerSM`` (programs per SM the grid is sized for; 0 = the kernel's resources: estimated for
split, read from the compiled kernel for balanced), ``num_warps`` (always 4), ``HeadSum``
(``fp32``, the default; ``tensor``: the head sum on the tensor cores, see :func:`tensor_fits`).

The resource rules (:func:`resources`, :func:`fits`) estimate what ptxas allocates for a
kernel of the given tiles, so the candidates never spill and the split rule
(:func:`derive_splits`) never promises more programs per SM than the compiled kernel holds;
the warp-specialised variant (``wgmma_ws.py``) builds on them.
"""

from __future__ import annotations

import math

from ...arch import lds_limit
from ...problem import LaunchArgs, Problem
from ...schedule import persistent_programs
from ...triton_internals.specialise import StandIn
from ..base import MAX_SPLIT_KV
from . import common
from .kernels.wgmma import HEAD_DIM, NUM_WARPS, headsum_columns, row_groups, wgmma_logits_kernel
from .variant import GluonVariant

CHUNK_SIZES = (64, 128, 256)
MAX_MMA_N = 256  # wgmma's largest N
#: fp32 registers per thread the live accumulators may take (of the 255 ptxas allows)
ACC_REG_BUDGET = 128
SM_REGISTERS = 65536
SM_SHARED_BYTES = 228 * 1024  # per SM; one program may use lds_limit("sm_90")
SM_COUNT_H100 = 132  # used only when a problem carries no SM count (hypothetical problems)


def _pow2_floor(x: int) -> int:
    return 1 << (max(int(x), 1).bit_length() - 1)


def max_rows_per_mma(heads: int) -> int:
    return max(1, min(8, MAX_MMA_N // heads))


def rows_per_mma(problem: Problem, rows: int) -> int:
    """``RowsPerMMA`` as the kernel runs it: at most the largest power of two <= next_n."""
    return min(rows, _pow2_floor(problem.shape_key.next_n))


def problem_row_groups(problem: Problem, rows: int) -> tuple:
    """``(first_row, rows)`` of each wgmma of ``problem`` at ``RowsPerMMA`` ``rows``."""
    return row_groups(problem.shape_key.next_n, rows_per_mma(problem, rows))


def live_accumulators(problem: Problem, groups, chunk: int) -> int:
    """fp32 accumulator registers per thread live at once while ``groups`` are scored in turn:
    one group's, or two consecutive groups' while one is reduced and the next computed (0 for
    no group)."""
    widths = [r * problem.shape_key.heads * (chunk // 64) for _, r in groups]  # accumulator columns x M repeats
    pairs = [a + b for a, b in zip(widths, widths[1:])] or widths or [0]
    return max(pairs) // 2


def resources(problem: Problem, chunk: int, rows: int, stages: int, head_sum: str = "fp32") -> dict:
    """Host-side estimate of a program's footprint, calibrated on ptxas's reports for every
    (heads, next_n, RowsPerMMA, ChunkK) of the contract (tests/backends/gluon/
    test_compile_wgmma.py checks the candidates never spill):

    * ``acc_regs``: fp32 accumulator registers per thread that are live at once (one group, or
      two consecutive groups while one is reduced and the next computed);
    * ``acc_budget``: what ``acc_regs`` may reach without spills: 128, but 64 from three row
      groups on (ptxas then keeps more of the unrolled epilogues' state live);
    * ``regs_estimate``: accumulators, the weights when one group keeps them in registers, ~36
      of addresses and loop state, ~12 per row group beyond two (fit to ptxas, +-20);
    * ``smem``: the key/scale ring, Q, the weights and the row limits;
    * ``ctas_per_sm``: programs an SM holds (registers, shared memory), for ``SplitKV = 0``.

    With ``HeadSum=tensor`` every row group's accumulator is live at once, beside the head sum's
    registers (:func:`tensor_head_sum_registers`), and the head-sum weights join the shared memory.
    """
    groups = problem_row_groups(problem, rows)
    acc_regs = live_accumulators(problem, groups, chunk)
    key = problem.shape_key
    weight_regs = groups[0][1] * key.heads // 4 if len(groups) == 1 else 0  # kept in registers
    regs = min(255, acc_regs + weight_regs + 36 + (12 * len(groups) if len(groups) > 2 else 0))
    q_rows = triton_next_pow2(key.next_n) * key.heads
    smem = stages * chunk * (HEAD_DIM + 4) + q_rows * (HEAD_DIM + 4) + 4 * triton_next_pow2(key.next_n)
    if head_sum == "tensor":
        acc_regs, need = tensor_head_sum_registers(problem, chunk, groups)
        regs = min(255, need + 36)
        smem += headsum_bytes(problem, rows, 1, 1)
    by_regs = SM_REGISTERS // ((-(-regs // 8) * 8) * 32 * NUM_WARPS)
    by_smem = SM_SHARED_BYTES // (smem + 1024)  # the driver reserves 1 KB per program
    return {"acc_regs": acc_regs, "acc_budget": ACC_REG_BUDGET if len(groups) <= 2 else ACC_REG_BUDGET // 2,
            "regs_estimate": regs, "smem": smem, "ctas_per_sm": max(1, min(by_regs, by_smem, 8))}


def unequal_groups_reason(problem: Problem, rows: int) -> str | None:
    """Why ``HeadSum=tensor`` cannot run at ``RowsPerMMA`` ``rows`` (None if it can): one shape of
    head-sum weights buffer serves a consumer, so its row groups must be equal."""
    if problem.shape_key.next_n % rows_per_mma(problem, rows):
        return f"next_n a multiple of RowsPerMMA (equal row groups), got next_n {problem.shape_key.next_n}"
    return None


def headsum_bytes(problem: Problem, rows: int, consumers: int, split: int) -> int:
    """``HeadSum=tensor``: per consumer and row group of its part (every ``split``-th group), the
    ``[n, rows * H]`` bf16 split weights (n = ``headsum_columns(rows)``: a hi and a lo column per
    row, at least wgmma's smallest N)."""
    groups = problem_row_groups(problem, rows)
    group_rows = groups[0][1]
    return consumers * len(groups[::split]) * headsum_columns(group_rows) * group_rows * problem.shape_key.heads * 2


def tensor_head_sum_registers(problem: Problem, chunk: int, groups) -> tuple[int, int]:
    """``HeadSum=tensor``, a warpgroup scoring ``groups`` of a tile with every score wgmma in flight:
    ``(accumulators, registers)`` per thread: the groups' fp32 accumulators, and those plus one
    group's packed bf16 scores (half its accumulator) and each group's head-sum accumulator."""
    heads = problem.shape_key.heads
    accumulators = sum(chunk * r * heads for _, r in groups) // 128
    packed = chunk * groups[0][1] * heads // 256
    head_sums = sum(chunk * headsum_columns(r) for _, r in groups) // 128
    return accumulators, accumulators + packed + head_sums


#: registers per thread ptxas may give this kernel's warpgroup
MAX_THREAD_REGISTERS = 255


def tensor_fits(problem: Problem, chunk: int, rows: int, stages: int, extra_regs: int = 0) -> bool:
    """``HeadSum=tensor``: equal row groups (one weights buffer shape), at most two
    (ptxas spills more), their accumulators within the budget and all of :func:`resources`'
    registers (``extra_regs`` more: what a variant holds beside them) within a thread's, the ring
    and the head-sum weights within shared memory."""
    groups = problem_row_groups(problem, rows)
    if unequal_groups_reason(problem, rows) is not None or len(groups) > 2:
        return False
    r = resources(problem, chunk, rows, stages, "tensor")
    return (r["acc_regs"] <= ACC_REG_BUDGET and r["regs_estimate"] + extra_regs <= MAX_THREAD_REGISTERS
            and r["smem"] <= lds_limit("sm_90"))


def triton_next_pow2(x: int) -> int:
    return 1 << (max(int(x), 1) - 1).bit_length()


def fits(problem: Problem, chunk: int, rows: int, stages: int) -> bool:
    r = resources(problem, chunk, rows, stages)
    return r["acc_regs"] <= r["acc_budget"] and r["smem"] <= lds_limit("sm_90")


def derive_splits(cu_num: int, batch: int, context: int, chunk: int, ctas_per_sm: int) -> int:
    """``SplitKV = 0``: programs per sequence for one wave of ``cu_num * ctas_per_sm`` programs,
    with equal tile counts: the most splits the wave allows, then as few as give the same
    tiles per program (a partial extra wave or unequal shares would set the time)."""
    tiles = max(1, math.ceil(max(context, 1) / chunk))
    slots = max(1, cu_num or SM_COUNT_H100) * max(1, ctas_per_sm)
    most = max(1, min(tiles, slots // max(batch, 1)))
    per_program = math.ceil(tiles / most)
    return max(1, math.ceil(tiles / per_program))


def resident_programs(compiled) -> int | None:
    """Programs of a compiled kernel one SM holds at once, from its real register and shared
    memory use (``None`` when the kernel object does not say). The balanced schedule sizes its
    persistent grid with it: a grid one program per SM too large runs a second, almost empty
    wave that doubles the time, and the estimate of :func:`resources` is only a fit."""
    try:
        compiled._init_handles()
        regs, shared = int(compiled.n_regs), int(compiled.metadata.shared)
    except Exception:  # a kernel object of another Triton version, or a stand-in
        return None
    if regs <= 0:
        return None
    warp_regs = -(-regs * 32 // 256) * 256  # registers are allocated per warp, 256 at a time
    by_regs = SM_REGISTERS // (warp_regs * NUM_WARPS)
    by_smem = SM_SHARED_BYTES // (shared + 1024)  # the driver reserves 1 KB per program
    return max(1, min(by_regs, by_smem, 8))


def alignment(q, kv) -> dict:
    """Per-call constexprs from the tensors' addresses and strides (what the JIT specialises on
    anyway, so they add no kernel variants): see :func:`alignment_of`."""
    return alignment_of(q.data_ptr(), q.stride()[:3], kv.data_ptr(), kv.stride(0))


#: the ``KV_ALIGN`` values of :func:`alignment_of`: 16-byte aligned cache blocks, else the 4 bytes
#: the contract guarantees
KV_ALIGNS = (16, 4)


def alignment_of(q_address: int, q_strides, kv_address: int, kv_block_stride: int) -> dict:
    """``KV_ALIGN`` 16 or 4 (see ``wgmma.issue_tile``), ``Q_ASYNC`` when every q row starts
    16-byte aligned."""
    kv_aligned = kv_address % 16 == 0 and kv_block_stride % 16 == 0
    q_async = q_address % 16 == 0 and all(s % 16 == 0 for s in q_strides)
    aligned, least = KV_ALIGNS
    return {"KV_ALIGN": aligned if kv_aligned else least, "Q_ASYNC": q_async}


def rows_options(problem: Problem) -> list[int]:
    """RowsPerMMA values that change the kernel, widest first."""
    widest = min(max_rows_per_mma(problem.shape_key.heads), _pow2_floor(problem.shape_key.next_n))
    return [widest >> k for k in range(widest.bit_length())]


def stages_for(chunk: int) -> tuple[int, int]:
    """A shallow and a deep ring per tile size: >= 2 tiles in flight while one is scored."""
    return {64: (4, 6), 128: (3, 4), 256: (2, 3)}[chunk]


class WgmmaVariant(GluonVariant):
    name = "wgmma"
    archs = ("sm_90",)
    #: allowed values per knob (combinations are judged by :meth:`knobs`)
    knob_space = {"ChunkK": CHUNK_SIZES, "RowsPerMMA": (1, 2, 4, 8), "num_stages": range(2, 9),
                  "SplitKV": range(0, MAX_SPLIT_KV + 1), "CtasPerSM": range(0, 9), "num_warps": (NUM_WARPS,),
                  "Schedule": common.SCHEDULES, "HeadSum": common.HEAD_SUMS}
    kernel = wgmma_logits_kernel

    # ------------------------------------------------------------------------- knobs
    def tile_knobs(self, problem: Problem, config: dict,
                   default_keys=("ChunkK", "RowsPerMMA", "num_stages")) -> tuple[dict, dict]:
        """``ChunkK``, ``RowsPerMMA``, ``num_stages`` (the default config's where any of
        ``default_keys`` is unset), checked against wgmma's limits for the problem's heads; and
        the default config consulted (empty when every one of ``default_keys`` is set)."""
        default = self.default_config(problem) if any(config.get(k) is None for k in default_keys) else {}
        chunk = int(config.get("ChunkK") or default["ChunkK"])
        rows = int(config.get("RowsPerMMA") or default["RowsPerMMA"])
        stages = int(config.get("num_stages") or default["num_stages"])
        self.require_in("ChunkK", chunk, self.knob_space["ChunkK"])
        self.require(rows >= 1 and not rows & (rows - 1), "RowsPerMMA", rows, "a power of two")
        self.require(rows * problem.shape_key.heads <= MAX_MMA_N, "RowsPerMMA", rows,
                     f"RowsPerMMA x heads <= {MAX_MMA_N} (wgmma's largest N), "
                     f"got {rows} x {problem.shape_key.heads} heads")
        self.require(2 <= stages <= 8, "num_stages", stages, "an integer in 2..8")
        warps = int(config.get("num_warps") or NUM_WARPS)
        self.require(warps == NUM_WARPS, "num_warps", warps, f"{NUM_WARPS} (one warpgroup)")
        return {"ChunkK": chunk, "RowsPerMMA": rows, "num_stages": stages}, default

    def head_sum_knob(self, problem: Problem, config: dict, rows: int) -> str:
        """``HeadSum`` (unset: ``fp32``); ``tensor`` needs equal row groups at ``RowsPerMMA``."""
        head_sum = config.get("HeadSum") or common.HEAD_SUMS[0]
        self.require_in("HeadSum", head_sum, common.HEAD_SUMS)
        if head_sum == "tensor":
            reason = unequal_groups_reason(problem, rows)
            self.require(reason is None, "HeadSum", head_sum, reason)
        return head_sum

    def knobs(self, problem: Problem, config: dict) -> dict:
        """Unset knobs take the default config's values (``SplitKV``, ``CtasPerSM``: 0)."""
        tile, _ = self.tile_knobs(problem, config)
        split = int(config.get("SplitKV") or 0)
        ctas = int(config.get("CtasPerSM") or 0)
        self.require(split >= 0, "SplitKV", split, "an integer >= 0")
        self.require(ctas >= 0, "CtasPerSM", ctas, "an integer >= 0")
        return {**tile, "SplitKV": split, "CtasPerSM": ctas, "num_warps": NUM_WARPS,
                "Schedule": self.schedule(problem, config),
                "HeadSum": self.head_sum_knob(problem, config, tile["RowsPerMMA"])}

    def admits(self, problem: Problem, config: dict) -> bool:
        k = self.knobs(problem, config)
        if k["HeadSum"] == "tensor":
            return tensor_fits(problem, k["ChunkK"], k["RowsPerMMA"], k["num_stages"])
        return fits(problem, k["ChunkK"], k["RowsPerMMA"], k["num_stages"])

    def shape_reason(self, problem: Problem) -> str | None:
        if problem.shape_key.heads > MAX_MMA_N:
            return (f"heads must be <= {MAX_MMA_N} (one wgmma N covers all heads of a row), "
                    f"got {problem.shape_key.heads}")
        if not any(fits(problem, 64, 1, stages) for stages in (2, 3)):
            return f"no tile configuration fits sm_90's registers and shared memory for {problem.describe()}"
        return None

    # ------------------------------------------------------------------------- candidates
    def candidate_groups(self, problem: Problem):
        """The fp32 settings (:meth:`fp32_candidates`), then each again with ``HeadSum=tensor`` where
        :func:`tensor_fits` admits it (so the default stays fp32 until a table row names tensor)."""
        settings = list(self.fp32_candidates(problem))
        yield from settings
        for group in settings:
            tensor = [dict(setting, HeadSum="tensor") for setting in group]
            if all(unequal_groups_reason(problem, s["RowsPerMMA"]) is None and self.admits(problem, s)
                   for s in tensor):
                yield tensor

    def fp32_candidates(self, problem: Problem):
        """The two widest row groupings that fit, x ChunkK 64/128 x a shallow and a deep ring; and,
        where the derived split count is large (latency-bound shapes), half of it."""
        groupings = 0
        for rows in rows_options(problem):
            fitting = [(chunk, stages) for chunk in (64, 128) for stages in stages_for(chunk)
                       if fits(problem, chunk, rows, stages)]
            for chunk, stages in fitting:
                for schedule in (common.BALANCED, common.SPLIT):
                    yield [{"ChunkK": chunk, "RowsPerMMA": rows, "num_stages": stages, "SplitKV": 0, "CtasPerSM": 0,
                            "num_warps": NUM_WARPS, "Schedule": schedule, "HeadSum": "fp32"}]
            groupings += bool(fitting)
            if groupings == 2:
                break
        base = dict(self.default_config(problem), Schedule=common.SPLIT)
        derived = self.num_splits(problem, base)
        if derived >= 8:
            yield [dict(base, SplitKV=derived // 2)]

    def default_config(self, problem: Problem) -> dict:
        """The widest row grouping that fits (one wgmma for all rows when N <= 256 allows it:
        fewest A-tile reads, no second accumulator); 128-token tiles when a group is at most 64
        columns wide (per-tile overheads dominate narrow tiles), else 64; the shallow ring."""
        for rows in rows_options(problem):
            for chunk in ((128, 64) if rows * problem.shape_key.heads <= 64 else (64, 128)):
                for stages in stages_for(chunk) + (2,):
                    if fits(problem, chunk, rows, stages):
                        return {"variant": self.name, "ChunkK": chunk, "RowsPerMMA": rows, "num_stages": stages,
                                "SplitKV": 0, "CtasPerSM": 0, "num_warps": NUM_WARPS,
                                "Schedule": common.default_schedule(problem), "HeadSum": "fp32"}
        raise ValueError(f"{self.owner}: no configuration fits {problem.describe()}")

    # ------------------------------------------------------------------------- launch plan
    def programs_per_sm(self, problem: Problem, config: dict) -> int:
        """``CtasPerSM``, or the programs an SM holds by :func:`resources` when it is 0."""
        k = self.knobs(problem, config)
        return k["CtasPerSM"] or resources(problem, k["ChunkK"], k["RowsPerMMA"], k["num_stages"],
                                           k["HeadSum"])["ctas_per_sm"]

    def num_splits(self, problem: Problem, config: dict) -> int:
        """``Schedule=split``: programs per sequence (``SplitKV``, or :func:`derive_splits`)."""
        k = self.knobs(problem, config)
        if k["SplitKV"] > 0:
            return k["SplitKV"]
        return derive_splits(problem.cu_num, problem.shape_key.batch, problem.work_context, k["ChunkK"],
                             self.programs_per_sm(problem, config))

    def grid(self, problem: Problem, config: dict, compiled=None) -> tuple[tuple[int, int], int]:
        """``(grid, num_splits)``: one persistent wave of ``SMs * programs_per_sm`` programs
        (balanced; the compiled kernel's own occupancy when ``CtasPerSM = 0`` and it is given),
        or ``(splits, batch)`` programs (split)."""
        k = self.knobs(problem, config)
        if k["Schedule"] == common.BALANCED:
            per_sm = k["CtasPerSM"] or (compiled is not None and resident_programs(compiled)) \
                or self.programs_per_sm(problem, config)
            return (persistent_programs(problem.cu_num or SM_COUNT_H100, per_sm), 1), 1
        splits = self.num_splits(problem, config)
        return (splits, problem.shape_key.batch), splits

    def constexprs(self, problem: Problem, config: dict) -> dict:
        k = self.knobs(problem, config)
        key = problem.shape_key
        return dict(NEXT_N=key.next_n, NEXT_N_POW2=triton_next_pow2(key.next_n), HEADS=key.heads,
                    KV_BLOCK_SIZE=key.kv_block_size, CHUNK=k["ChunkK"],
                    ROWS_PER_MMA=rows_per_mma(problem, k["RowsPerMMA"]), STAGES=k["num_stages"],
                    PRESHUFFLE=key.preshuffle, LENS_2D=problem.lens_2d,
                    BALANCED=k["Schedule"] == common.BALANCED, HEAD_SUM=int(k["HeadSum"] == "tensor"))

    def options(self, problem: Problem, config: dict) -> dict:
        return {"num_warps": NUM_WARPS}

    def call_constexprs(self, args: LaunchArgs) -> dict:
        return alignment(args.q, args.kv_cache)

    def plan(self, args: LaunchArgs, config: dict) -> tuple[tuple, int, dict]:
        """Grid ``(splits, batch)`` (split) or one persistent wave (balanced). No host sync, no
        allocation at launch: the plan is cached by the base."""
        p = args.problem
        kwargs = {**self.constexprs(p, config), **self.options(p, config)}
        compiled = None
        if kwargs["BALANCED"]:  # the grid follows the compiled kernel's occupancy (compiled here once)
            try:
                compiled = self.kernel.warmup(*common.kernel_arguments(args, 1), grid=(1,), **kwargs,
                                              **self.call_constexprs(args))
            except Exception:  # no loaded kernel to ask (a stand-in driver): the estimate sizes the grid
                compiled = None
        return (*self.grid(p, config, compiled), kwargs)

    # ------------------------------------------------------------------------- compile specs
    def spec_arguments(self, problem: Problem, cfg: dict) -> tuple[tuple, dict, dict]:
        """A typical vLLM call of ``problem``: ``cfg``'s ``block_stride_pad`` pads the cache block
        stride (4: not 16-byte aligned), ``q_misaligned`` puts q rows at an odd address (the
        plain-load Q path). The alignment constexprs join the knobs (``kvalign``, ``qasync``), so
        each path has its own spec name."""
        runtime = list(common.typical_arguments(problem))
        if cfg.get("block_stride_pad"):
            runtime[10] += int(cfg["block_stride_pad"])
        if cfg.get("q_misaligned"):
            runtime[0] = StandIn(runtime[0].dtype, runtime[0].ptr_range(), aligned=False)
        aligned = alignment_of(runtime[0].data_ptr(), runtime[7:10], runtime[1].data_ptr(), runtime[10])
        return (tuple(runtime), {**self.constexprs(problem, cfg), **aligned},
                {"kvalign": aligned["KV_ALIGN"], "qasync": int(aligned["Q_ASYNC"])})

    def kernel_key(self, problem: Problem, cfg: dict) -> tuple:
        """What makes two configs of one problem compile to the same kernel."""
        return tuple(sorted(self.constexprs(problem, cfg).items()))

    def matrix_candidates(self, problem: Problem) -> list[dict]:
        return self.candidates(problem) + [self.default_config(problem)]

    def compile_matrix(self, arch: str) -> list[dict]:
        """Every candidate of ``common.representative_problems`` (deduplicated by kernel)."""
        out, seen = [], set()
        for fields in common.representative_problems(arch):
            problem = common.problem_for(arch, self.fp8[arch], fields)
            for cand in self.matrix_candidates(problem):
                key = self.kernel_key(problem, cand)
                if key not in seen:
                    seen.add(key)
                    out.append(dict(fields, **cand))
        return out


VARIANT = WgmmaVariant()
