"""gfx942 / gfx950 (CDNA3 / CDNA4) variant of the ``gluon`` backend: fp8 MFMA, buffer loads.

The kernel body is :func:`kernels.register_mma.register_mma_logits_kernel`, its AMD atoms are
``kernels/mfma.py``; this module holds the rules of the host side (knobs, resource fits, candidates, compile layouts).

Atoms:

* accumulator: ``AMDMFMALayout`` (v3 on gfx942, v4 on gfx950), not transposed, 4 waves side by
  side along the tokens. A lane then holds one token column and 16 (32x32 MFMA) or 4 (16x16)
  heads of it: the head sum is in-lane adds plus one (two) cross-lane steps. 32x32 tiles need
  32 tokens per wave, so ``ChunkK = 64`` (16 tokens per wave) uses 16x16 MFMA.
* MMA: ``Mfma = "fp8"``: plain fp8 MFMA, ``v_mfma_f32_32x32x16_fp8_fp8`` / ``16x16x32``
  (e4m3fnuz on gfx942, e4m3fn on gfx950); ``Mfma = "f8f6f4"`` (gfx950 only):
  ``v_mfma_scale_f32_32x32x64_f8f6f4`` / ``16x16x128`` through ``cdna4.mfma_scaled`` with unit
  scales (e8m0 127 = 2^0), the same products and fp32 accumulation at twice the MFMA rate and a
  quarter of the instructions; it is gfx950's default.
* loads: ``buffer_load`` from a 64-bit scalar base with 32-bit offsets (block table, q, weights);
  the cache through ``buffer_load`` when the host proved every cache byte lies within 2^31 of
  the base (``KV_32BIT``), else 64-bit ``global_load`` gathers.

Knobs: ``ChunkK`` (64/128/256 tokens per tile), ``WavePerEU`` (1/2/4: the ``waves_per_eu``
register budget, and the programs per CU that ``SplitKV = 0`` sizes the grid for),
``SplitKV`` (0 = ``derive_split_kv`` on the host), ``ReuseKV`` (0: a program per query row,
which re-reads the keys from L2; 1: a program per sequence scores every next_n row against
each key tile it reads once), ``Mfma`` (gfx950), ``QInLDS`` (query rows and weights staged in
LDS and read per tile, 64 heads per MFMA, instead of held in VGPRs), ``Prefetch`` (1: keys of the
next tile in flight while this one is scored; 2: the same, two tiles per loop iteration in
alternating registers, so no register copy per tile; 0: one tile per wave), ``KeyLoad`` (plain caches:
keys gathered straight into the MFMA operand, or in whole rows and converted through LDS;
``cdna_keys.py``), ``HeadSum`` (gfx950: ``fp32``, the default, or ``tensor``: the weighted head
sum as a bf16 MFMA on the score accumulator's registers, docs/AMD_HEADSUM.md; never a candidate). ``candidates`` offers every (ChunkK, WavePerEU, ReuseKV/QInLDS, Mfma) that
:meth:`MfmaVariant.admits`, with Prefetch where it fits, then the same with ``KeyLoad=lds`` for
plain caches.
"""

from __future__ import annotations

import dataclasses

from ...arch import ARCH_SPECS
from ...problem import Problem
from ...triton_internals.specialise import StandIn, runtime_parameters
from ...triton_internals.toolchain import AMD_VGPR_MARGIN
from ..base import MAX_SPLIT_KV, CompileSpec
from . import cdna_keys, common
from .register_mma import CHUNK_SIZES, RegisterMmaVariant, rows_per_program
from .kernels.mfma import (NUM_WARPS, buffer_gather, cache_gather, gather_layout, keys_through_lds, keys_to_operand,
                           mfma_bf16_head_sum, mfma_f8f6f4, mfma_fp8, mfma_layout)
from .kernels.register_mma import register_mma_logits_kernel

#: MFMA families per arch, default first
MFMA_KINDS = {"gfx942": ("fp8",), "gfx950": ("f8f6f4", "fp8")}
WAVES_PER_EU = (1, 2, 4)
THREADS_PER_WARP = 64
#: heads per MFMA when Q is read from LDS: two 32-row tiles (32 measured no better)
HEAD_CHUNK = 64
#: ``HeadSum``: the weighted head sum in fp32 VALU ops (default), or as a bf16 MFMA (docs/AMD_HEADSUM.md)
HEAD_SUMS = common.HEAD_SUMS
#: archs where ``HeadSum=tensor`` pays in the cycle model: gfx942 has no packed bf16 convert and its
#: bf16 MFMA alone takes longer than today's whole loop iteration (docs/AMD_HEADSUM.md)
TENSOR_HEAD_SUM_ARCHS = ("gfx950",)


# ----------------------------------------------------------------------------- resource rules
def lds_bytes(rows: int, heads: int, q_lds: int, head_dim: int = 128) -> int:
    """Shared memory of one program: the staged query rows and their weights."""
    return rows * heads * (head_dim + 4) if q_lds else 0




#: VGPRs the balanced schedule's segment loop keeps live on top of a split program's (its
#: cursor, the share's bounds and the sequence's length state across the tile loop)
BALANCED_VGPRS = 24
#: Prefetch settings, preferred first: the two-tile loop saves the ChunkK/8 register copies per
#: lane and tile of the one-tile prefetch (measured in tools/amd_side_by_side.py), so the
#: one-tile prefetch is offered only where the two-tile loop does not fit
PREFETCHES = (2, 1, 0)
#: VGPRs the two-tile loop needs beyond the one-tile prefetch's estimate (the same keys are in
#: flight; at exactly the estimate's budget it spilled, gfx942 H 64 ChunkK 128 WavePerEU 4)
PING_PONG_VGPRS = 1


def _fits(problem: Problem, chunk: int, waves: int, rows: int, q_lds: int, prefetch: int,
          balanced: bool = False, key_load: str = cdna_keys.DIRECT) -> bool:
    if prefetch == 2 and not _ping_pong_allowed(q_lds, key_load):
        return False
    key = problem.shape_key
    lds = lds_bytes(rows, key.heads, q_lds) + cdna_keys.lds_bytes(chunk, key_load, key.head_dim)
    if lds * waves > ARCH_SPECS[problem.arch].lds_bytes:
        return False
    if balanced and prefetch and (waves >= 4 or not problem.kv_aligned16 or not problem.kv_32bit):
        # measured: the segment loop and a prefetched tile do not fit together at 128 VGPRs, nor
        # beside the per-dword addresses of 4-byte key gathers (padded or unaligned caches) or
        # the 64-bit addresses of caches past 2 GiB
        return False
    # the cache layout of the call: the JIT proves 16-byte key gathers only when the base and the
    # real block stride are 16-byte multiples; caches past 2 GiB take 64-bit addresses
    need = vgpr_estimate(key.heads, chunk, rows, q_lds, problem.kv_aligned16, prefetch, problem.kv_32bit) \
        + AMD_VGPR_MARGIN + (BALANCED_VGPRS if balanced else 0) + cdna_keys.vgprs(chunk, key_load, prefetch, NUM_WARPS) \
        + (PING_PONG_VGPRS if prefetch == 2 else 0)
    return need <= ARCH_SPECS[problem.arch].vgprs_per_simd // waves


def _ping_pong_allowed(q_lds: int, key_load: str) -> bool:
    """The two-tile loop keeps Q in VGPRs and gathers keys straight into the operand: with Q
    staged in LDS each tile re-reads it and the doubled reads spilled (measured on both chips)."""
    return not q_lds and key_load == cdna_keys.DIRECT


def vgpr_estimate(heads: int, chunk: int, rows: int, q_lds: int, aligned: bool = True, prefetch: int = 1,
                  kv_32bit: bool = True) -> int:
    """VGPRs per lane the kernel needs at least: what is live across one MFMA of a tile.

    With ``T = ChunkK / 4`` tokens per wave and ``HC`` heads per MFMA (all heads with Q in
    registers, at most :data:`HEAD_CHUNK` from LDS):

    * fp32 scores ``HC*T/64``;
    * keys of this tile and, with ``Prefetch``, the next: ``T*128 B / 64 lanes / 4 = T/2`` each;
    * Q in registers: the operand (``H*128 B / 64 / 4 = H/2``) and the weights (``H/2``: a lane
      holds 16 of every 32 heads) of every row;
    * Q from LDS: one head chunk's operand ``HC/2`` (its weights come after the MFMA), plus the
      next row's operand and weights (``HC``) in flight when a program has several rows; with
      more heads than one chunk (128), every chunk's scores and operand plus the running sum;
    * caches whose base or block stride is not a 16-byte multiple (``kv_block_size`` 1:
      132-byte blocks; strides padded by 4 bytes; a base 4 bytes off) gather keys 4 bytes at a
      time, one address per dword: ``3*T`` more;
    * caches past 2 GiB (``kv_32bit`` false): 64-bit per-lane addresses for the gathers,
      ``3T/8`` more (without it ChunkK 128 and 256 at WavePerEU 4 spilled).

    Calibrated on gfx942 and gfx950 (both MFMA kinds) over heads 32/64 (16/128 spot-checked), ChunkK 64/128/256,
    WavePerEU 1/2/4, per-row / shared-KV, Q in VGPRs / LDS, with and without Prefetch,
    next_n 1-8, block sizes 1/16/64/256, plain and Preshuffle, and (h64 next_n 1, h32 next_n 8)
    block strides padded by 4 / 16 bytes, an unaligned base, the 64-bit path packed and padded:
    every knob set it admits compiles without scratch at its WavePerEU; it also rejects some
    that would just fit (the 64-bit path does not need 16-byte alignment to keep its VGPRs)."""
    t = chunk // NUM_WARPS
    hc = min(heads, HEAD_CHUNK) if q_lds else heads
    need = (t if prefetch else t // 2) + hc * t // 64
    if q_lds:
        need += hc // 2 + (hc if rows > 1 else 0)
        if heads > hc:  # the compiler overlaps the head chunks: count each one, plus the running sum
            need += (heads // hc - 1) * (hc * t // 64 + hc // 2) + 16
    else:
        need += rows * heads
    if not aligned:
        need += 3 * t
    if not kv_32bit:
        need += 3 * t // 8
    return need


# ----------------------------------------------------------------------------- compile layouts
#: cache layouts a compile config may name (``layout``), as Problem fields: packed blocks;
#: block strides padded by 4 and 16 bytes; a base 4 bytes past 16-byte alignment; past 2 GiB
#: (64-bit addresses), packed and padded
KV_LAYOUTS = {
    "packed": {},
    "pad4": {"kv_block_pad": 4},
    "pad16": {"kv_block_pad": 16},
    "unaligned": {"kv_base_aligned": False},
    "kv64": {"kv_32bit": False},
    "kv64_pad4": {"kv_32bit": False, "kv_block_pad": 4},
}


def layout_problem(problem: Problem, cfg: dict) -> Problem:
    """``problem`` with the cache layout a compile config names (``layout`` of
    :data:`KV_LAYOUTS`, or the older ``kv_32bit`` flag alone)."""
    fields = dict(KV_LAYOUTS[cfg.get("layout", "packed")])
    pad = fields.pop("kv_block_pad", 0)
    if "kv_32bit" in cfg:
        fields["kv_32bit"] = bool(cfg["kv_32bit"])
    stride = problem.kv_stride_bytes + pad if pad else 0
    return dataclasses.replace(problem, kv_block_stride=stride, **fields)


def _layout_arguments(problem: Problem) -> tuple:
    """:func:`common.typical_arguments` with the problem's cache layout: the cache pointers'
    alignment and the block stride are what the JIT specialises on (16-byte divisibility)."""
    names = runtime_parameters(register_mma_logits_kernel)
    values = list(common.typical_arguments(problem, kv_32bit=problem.kv_32bit))
    for name in ("kv_ptr", "scale_ptr"):
        stand_in = values[names.index(name)]
        values[names.index(name)] = StandIn(stand_in.dtype, stand_in.ptr_range(), problem.kv_base_aligned)
    values[names.index("stride_block")] = problem.kv_stride_bytes
    return tuple(values)


# ----------------------------------------------------------------------------- the variant
class MfmaVariant(RegisterMmaVariant):
    name = "mfma"
    archs = ("gfx942", "gfx950")
    #: allowed values per knob (combinations, e.g. Mfma per arch, are judged by :meth:`knobs`)
    knob_space = {"ChunkK": CHUNK_SIZES, "WavePerEU": WAVES_PER_EU, "SplitKV": range(0, MAX_SPLIT_KV + 1),
                  "ReuseKV": (0, 1), "Mfma": ("fp8", "f8f6f4"), "QInLDS": (0, 1), "Prefetch": PREFETCHES,
                  "Schedule": common.SCHEDULES, cdna_keys.KNOB: cdna_keys.KEY_LOADS, "HeadSum": HEAD_SUMS}
    head_chunk = HEAD_CHUNK
    kv_32bit_loads = True

    def knobs(self, problem: Problem, config: dict) -> dict:
        """Backend defaults for unset knobs.

        An unset ``QInLDS`` / ``Prefetch`` takes the first setting that fits the other knobs
        (Q in VGPRs for a per-row program, then in LDS; the two-tile prefetch, the one-tile
        prefetch, then none), so a table row
        that names only the common knobs (e.g. upstream's ChunkK 256 / WavePerEU 4) still gets a
        kernel that reaches its occupancy without spilling, when one exists. ``KeyLoad`` is
        there only when it is not ``direct``, and ``HeadSum`` only when it is not ``fp32``, so
        such configs, the names of their compiled kernels and the tuned rows are what they were
        before those knobs existed."""
        chunk = int(config.get("ChunkK") or 128)
        waves = int(config.get("WavePerEU") or 2)
        split = int(config.get("SplitKV") or 0)
        reuse = int(config.get("ReuseKV") or 0)
        kind = config.get("Mfma") or MFMA_KINDS[problem.arch][0]
        self.require_in("ChunkK", chunk, CHUNK_SIZES)
        self.require_in("WavePerEU", waves, WAVES_PER_EU)
        self.require(kind in MFMA_KINDS[problem.arch], "Mfma", kind,
                     f"one of {', '.join(MFMA_KINDS[problem.arch])} on {problem.arch}")
        schedule = self.schedule(problem, config)
        key_load = config.get(cdna_keys.KNOB) or cdna_keys.DIRECT
        self.require_in(cdna_keys.KNOB, key_load, cdna_keys.KEY_LOADS)
        self.require(key_load in cdna_keys.key_loads(problem.shape_key.preshuffle), cdna_keys.KNOB, key_load,
                     f"{cdna_keys.DIRECT} on a Preshuffle cache (already stored in the MFMA operand's order)")
        head_sum = config.get("HeadSum") or HEAD_SUMS[0]
        self.require_in("HeadSum", head_sum, HEAD_SUMS)
        self.require(head_sum == HEAD_SUMS[0] or problem.arch in TENSOR_HEAD_SUM_ARCHS, "HeadSum", head_sum,
                     f"fp32 on {problem.arch} (the bf16 MFMA head sum does not pay there: docs/AMD_HEADSUM.md)")
        rows = rows_per_program(problem.shape_key.next_n, reuse)
        q_options = [int(config["QInLDS"])] if config.get("QInLDS") is not None else ([0, 1] if rows == 1 else [1])
        prefetch_options = [int(config["Prefetch"])] if config.get("Prefetch") is not None else list(PREFETCHES)
        for pf in prefetch_options:
            self.require_in("Prefetch", pf, PREFETCHES)
        if prefetch_options == [2]:  # the two-tile loop keeps Q in VGPRs and gathers into the operand
            q_options = [q for q in q_options if _ping_pong_allowed(q, key_load)]
            self.require(bool(q_options), "Prefetch", 2, "0 or 1 with QInLDS=1 (shared-KV programs stage Q in LDS) "
                                                         "or KeyLoad=lds")
        settings = [(q, pf) for q in q_options for pf in prefetch_options]
        balanced = schedule == common.BALANCED
        q_lds, prefetch = next((s for s in settings if _fits(problem, chunk, waves, rows, *s, balanced, key_load)),
                               settings[0])
        return {"ChunkK": chunk, "WavePerEU": waves, "SplitKV": split, "ReuseKV": reuse, "Mfma": kind,
                "QInLDS": q_lds, "Prefetch": prefetch, "Schedule": schedule,
                **({cdna_keys.KNOB: key_load} if key_load != cdna_keys.DIRECT else {}),
                **({"HeadSum": head_sum} if head_sum != HEAD_SUMS[0] else {})}

    def admits(self, problem: Problem, config: dict) -> bool:
        """Whether a knob set reaches the occupancy ``WavePerEU`` asks for, with no spills.

        LDS: ``WavePerEU`` programs (4 waves each: one per SIMD) share the CU's LDS (64 KiB
        gfx942, 160 KiB gfx950), plus the key conversion's LDS with ``KeyLoad=lds``. VGPRs:
        ``512 / WavePerEU`` per lane against :func:`vgpr_estimate` (plus ``cdna_keys.vgprs``)."""
        k = self.knobs(problem, config)
        return _fits(problem, k["ChunkK"], k["WavePerEU"], self.rows(problem, k), k["QInLDS"], k["Prefetch"],
                     k["Schedule"] == common.BALANCED, k.get(cdna_keys.KNOB, cdna_keys.DIRECT))

    def candidate_groups(self, problem: Problem):
        """The direct groups, then (plain caches) the same groups with ``KeyLoad=lds``: the direct
        candidates come first and keep no ``KeyLoad`` key. A conversion through LDS only adds
        LDS and VGPRs, so an ``lds`` group admits nothing its direct twin does not, and its
        first admitted setting is the twin's or one without Prefetch."""
        for key_load in cdna_keys.key_loads(problem.shape_key.preshuffle):
            extra = {} if key_load == cdna_keys.DIRECT else {cdna_keys.KNOB: key_load}
            for group in self._direct_groups(problem):
                yield [dict(setting, **extra) for setting in group
                       if setting["Prefetch"] != 2 or _ping_pong_allowed(setting["QInLDS"], key_load)]

    def _direct_groups(self, problem: Problem):
        for schedule in common.SCHEDULES:
            for kind in MFMA_KINDS[problem.arch]:
                # per-row programs with Q in VGPRs or in LDS; shared-KV programs stage Q in LDS
                for reuse, q_lds in ((0, 0), (0, 1), (1, 1)) if problem.shape_key.next_n > 1 else ((0, 0), (0, 1)):
                    for chunk in CHUNK_SIZES:
                        for waves in WAVES_PER_EU:
                            # register-double-buffered tiles where they fit (two per iteration first),
                            # else one tile per wave
                            yield [{"ChunkK": chunk, "WavePerEU": waves, "SplitKV": 0, "ReuseKV": reuse, "Mfma": kind,
                                    "QInLDS": q_lds, "Prefetch": prefetch, "Schedule": schedule}
                                   for prefetch in PREFETCHES if prefetch != 2 or _ping_pong_allowed(q_lds, cdna_keys.DIRECT)]

    def default_config(self, problem: Problem) -> dict:
        """Upstream's fixed default (ChunkK 256, WavePerEU 2) where it fits, per-row programs with
        Q in VGPRs and the prefetch that fits (:meth:`knobs`)."""
        for chunk, waves in ((256, 2), (128, 2), (128, 1), (64, 1)):
            config = {"variant": self.name, "ChunkK": chunk, "WavePerEU": waves, "SplitKV": 0, "ReuseKV": 0,
                      "Mfma": MFMA_KINDS[problem.arch][0], "QInLDS": 0,
                      "Schedule": common.default_schedule(problem)}
            if self.admits(problem, config):
                break
        return dict(config, Prefetch=self.knobs(problem, config)["Prefetch"])

    def atoms(self, problem: Problem, knobs: dict) -> dict:
        kind = knobs["Mfma"]
        return dict(ACC=mfma_layout(problem.arch, problem.shape_key.heads, knobs["ChunkK"], kind), K_WIDTH=16,
                    MMA=mfma_f8f6f4 if kind == "f8f6f4" else mfma_fp8, LOAD=buffer_gather, LOAD_KV=cache_gather,
                    THREADS_PER_WARP=THREADS_PER_WARP, **self.key_atoms(problem, knobs))

    def head_sum(self, problem: Problem, knobs: dict):
        """``HeadSum=tensor``: the bf16 MFMA head sum (``kernels/mfma.py``), else the fp32 one."""
        if knobs.get("HeadSum", HEAD_SUMS[0]) == "tensor":
            return mfma_bf16_head_sum
        return super().head_sum(problem, knobs)

    def key_atoms(self, problem: Problem, knobs: dict) -> dict:
        """``KeyLoad=lds``: the gather layout and the conversion to the operand (``cdna_keys.py``);
        ``direct`` passes neither, so the kernel gathers into the operand layout itself."""
        if knobs.get(cdna_keys.KNOB, cdna_keys.DIRECT) == cdna_keys.DIRECT:
            return {}
        # tokens of one wave's MFMA column group: what a wave gathers per group
        tile = mfma_layout(problem.arch, problem.shape_key.heads, knobs["ChunkK"], knobs["Mfma"]).instr_shape[1]
        return dict(KEY_LAYOUT=gather_layout(tile, NUM_WARPS, THREADS_PER_WARP),
                    KEY_OPERAND=keys_to_operand if tile == 32 else keys_through_lds)

    def programs_per_cu(self, knobs: dict) -> int:
        # WavePerEU waves per SIMD = WavePerEU programs of 4 waves per CU.
        return knobs["WavePerEU"] * 4 // NUM_WARPS

    def options(self, problem: Problem, config: dict) -> dict:
        return {"num_warps": NUM_WARPS, "waves_per_eu": self.knobs(problem, config)["WavePerEU"]}

    # ------------------------------------------------------------------------- compile specs
    def spec_problem(self, arch: str, cfg: dict) -> Problem:
        """The config's problem on the cache ``layout`` it names (see :meth:`compile_matrix`)."""
        return layout_problem(super().spec_problem(arch, cfg), cfg)

    def spec_arguments(self, problem: Problem, cfg: dict) -> tuple[tuple, dict, dict]:
        """Specialised as the JIT specialises a typical vLLM call on that cache layout."""
        return _layout_arguments(problem), self.constexprs(problem, cfg, problem.kv_32bit), {}

    def compile_spec(self, arch: str, cfg: dict) -> CompileSpec:
        spec = super().compile_spec(arch, cfg)
        problem = self.spec_problem(arch, cfg)
        layout = cfg.get("layout", "packed")
        if layout not in ("packed", "kv64"):
            spec.name = f"{spec.name}_{layout}"
        spec.knobs.update(kv_32bit=problem.kv_32bit, layout=layout, kv_aligned16=problem.kv_aligned16)
        return spec

    def compile_matrix(self, arch: str) -> list[dict]:
        """Every candidate of a representative problem set (``common.representative_problems``),
        plus every candidate of the DeepSeek decode shape on each other cache layout
        (:data:`KV_LAYOUTS`; the index math is the same, the loads and registers are not)."""
        out = super().compile_matrix(arch)
        shape = {"heads": 64, "next_n": 1, "kv_block_size": 64, "preshuffle": True, "lens_2d": True}
        for layout in KV_LAYOUTS:
            if layout != "packed":
                problem = layout_problem(common.problem_for(arch, self.fp8[arch], shape), {"layout": layout})
                out += [dict(shape, **cand, layout=layout) for cand in self.candidates(problem)]
        return out


VARIANT = MfmaVariant()
