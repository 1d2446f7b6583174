"""Run the kernel body (``algorithm.py``) on NumPy lanes: the ``ops`` of ``ir.py`` modelled one
instruction at a time, so the kernel's own index math, LDS image, MFMA operand placement, head
reduction and masking can be checked against the reference on a CPU.

What is modelled (from the CDNA3/CDNA4 ISA documents; the assumptions a real MI300/MI355X run
confirms):

* a workgroup is 4 waves (8 with ``WaveRoles=split``) x 64 lanes run in lockstep; every value
  is an array over (wave, lane) (i32 / i64 / f32 keep their width, so 32-bit wrap-around shows
  up as it would on the GPU);
  ``uniform`` (``v_readfirstlane``) takes lane 0;
* branches (``if_then`` / ``if_value``) must be wave-uniform; where waves of a workgroup go
  different ways, each side runs with only its waves active (their stores and LDS writes land,
  the others' are dropped); a barrier inside a branch not taken by every wave is a fault (a
  hang on the GPU), and so are loop bounds that differ between the active waves;
* ``shuffle_up`` gives lanes ``< delta`` a wrapped-around lane's value (the GPU leaves them
  unspecified), so a kernel that forgets to mask them computes wrong sums here;
* raw buffer resources: a lane's access is dropped (store) or reads 0 (load) when
  ``offset + size > num_records``; soffset is not part of that check; any access that lands
  outside the tensor it was derived from raises (a fault on the GPU);
* LDS DMA: lane ``l`` writes ``nbytes`` at ``M0 + l * nbytes``; copies land at once (the
  lockstep order stands in for ``s_waitcnt vmcnt(0)`` + barrier, so a stage written into the
  buffer being read shows up as wrong results);
* ``v_mfma_f32_16x16x32_fp8_fp8``: lane ``l`` holds ``A[l % 16][8 * (l // 16) + e]`` and
  ``B[8 * (l // 16) + e][l % 16]`` (byte ``e`` of its i64) and receives
  ``D[4 * (l // 16) + i][l % 16]``; fp8 is e4m3fnuz on gfx942 and e4m3fn on gfx950;
* ``v_mfma_scale_f32_16x16x128_f8f6f4`` (gfx950, fp8 e4m3 A and B): lane ``l`` holds 32 bytes
  of each operand, byte ``e`` = K index ``16 * (l // 16) + e`` (``e < 16``) or
  ``64 + 16 * (l // 16) + e - 16``; each lane's bytes are multiplied by ``2^(scale - 127)`` of
  its e8m0 scale byte (opsel 0); the result is placed as for the 16x16x32 MFMA;
* the same instruction with fp4 e2m1 A and B (cbsz = blgp = 4): lane ``l`` holds 16 bytes of
  each operand, 32 codes, code ``e`` in byte ``e // 2`` (the low nibble first, as MXFP4 packs
  them) at K index ``32 * (l // 16) + e``; its e8m0 byte scales those 32 codes. (The kernel is
  indifferent to which K block the hardware assigns each lane quarter, since A and B follow the
  same rule; what it relies on is that one lane's 32 codes share its one scale byte.) An e8m0
  byte of 255 is NaN, as in the OCP MX format;
* ``v_perm_b32`` (selector bytes 0..7 only: byte ``s`` of ``hi:lo``, ``lo`` holding 0..3),
  ``v_ldexp_f32`` (``x * 2^n`` rounded once to fp32), ``ds_read_b32``.

Every MFMA a wave issues is counted (``EmulationStats.mfma``; per wave with the LDS DMAs in
``EmulationStats.by_wave``, so the tests see which waves copy and which score), and output
stores can be traced per workgroup (``trace_stores``): the tests check the schedule covers
every logit exactly once and that no MFMA runs on a padding row.

Imports no flydsl: the emulator runs wherever torch and numpy do.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from ...arch import native_fp8_dtype
from ...fp4 import E2M1_VALUES
from ...problem import LaunchArgs
from .algorithm import ARG_NAMES, KernelBody, grid, launch_arguments
from .plan import WAVE_SIZE, KernelPlan

_REGION_BITS = 40  # tensor k lives at addresses [(k + 1) << 40, (k + 2) << 40)


class EmulationFault(RuntimeError):
    """An access the GPU would fault on (outside every tensor, or misaligned LDS)."""


class _Memory:
    """The kernel's tensors as byte arrays sharing storage with the torch tensors."""

    def __init__(self):
        self.regions: list[np.ndarray] = []

    def tensor_address(self, tensor: torch.Tensor) -> int:
        storage = torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage())
        self.regions.append(storage.numpy())
        return (len(self.regions) << _REGION_BITS) + tensor.storage_offset() * tensor.element_size()

    def _locate(self, address: np.ndarray, nbytes: int):
        region = (address >> _REGION_BITS) - 1
        offset = address & ((1 << _REGION_BITS) - 1)
        if region.min() < 0 or region.max() != region.min() or region.max() >= len(self.regions):
            raise EmulationFault(f"access outside the kernel's tensors (addresses {np.unique(address)[:4]}...)")
        data = self.regions[int(region.flat[0])]
        if offset.min() < 0 or offset.max() + nbytes > data.size:
            raise EmulationFault(f"access past a tensor's storage (offset {offset.max()} + {nbytes} > {data.size})")
        return data, offset

    def read(self, address: np.ndarray, nbytes: int) -> np.ndarray:
        if address.size == 0:
            return np.zeros(address.shape + (nbytes,), np.uint8)
        data, offset = self._locate(address, nbytes)
        return data[offset[..., None] + np.arange(nbytes)]

    def write(self, address: np.ndarray, values: np.ndarray) -> None:
        if address.size == 0:
            return
        data, offset = self._locate(address, values.shape[-1])
        data[offset[..., None] + np.arange(values.shape[-1])] = values


def _e2m1(bytes_: np.ndarray) -> np.ndarray:
    """``[..., n]`` bytes of packed e2m1 pairs -> ``[..., 2n]`` float32 values, low nibble first."""
    codes = np.stack((bytes_ & 0xF, bytes_ >> 4), axis=-1).reshape(*bytes_.shape[:-1], -1)
    magnitude = np.asarray(E2M1_VALUES, np.float32)[codes & 7]
    return np.where(codes & 8, -magnitude, magnitude).astype(np.float32)


class _Resource:
    def __init__(self, address, num_records, shape):
        self.address = np.broadcast_to(address, shape).astype(np.int64)
        self.num_records = np.broadcast_to(num_records, shape).astype(np.int64)


@dataclass
class EmulationStats:
    #: MFMAs issued (one per wave and instruction), by mnemonic
    mfma: Counter = field(default_factory=Counter)
    #: instructions issued per wave of the workgroup, by kind (``"mfma"``, ``"lds_dma"``) and
    #: wave index: which waves copy and which score (``WaveRoles``)
    by_wave: Counter = field(default_factory=Counter)
    #: per workgroup ``(x, y)``: byte addresses of its output stores that landed (``trace_stores``)
    stores: dict = field(default_factory=dict)


class EmulatedOps:
    """The instruction set of ``ir.py`` for workgroup ``(x, y)`` (block ids)."""

    OUT_OF_RANGE = 0x7FFFFFFF

    def __init__(self, plan: KernelPlan, memory: _Memory, x: int, y: int, stats: EmulationStats | None = None,
                 trace_stores: bool = False):
        self.plan, self.memory, self.ids = plan, memory, (x, y)
        self.waves = plan.waves  # every wave of the workgroup, whatever its role
        self.shape = (self.waves, WAVE_SIZE)
        self.lds = np.zeros(0, np.uint8)
        self.fp8 = native_fp8_dtype(plan.arch)
        self.active = np.ones(self.waves, bool)  # waves executing the current branch
        self.stats = stats if stats is not None else EmulationStats()
        self.store_trace = self.stats.stores.setdefault(self.ids, []) if trace_stores else None

    # ------------------------------------------------------------------ integers
    def const32(self, v):
        return self._lanes(v)

    def _lanes(self, value, dtype=np.int32) -> np.ndarray:
        return np.broadcast_to(np.asarray(value, dtype=dtype), self.shape)

    def _int(self, v, like=None):
        if isinstance(v, np.ndarray):
            return v
        return self._lanes(v, like.dtype if isinstance(like, np.ndarray) else np.int32)

    def _pair(self, a, b):
        a2 = self._int(a, b)
        return a2, self._int(b, a2)

    def add(self, a, b):
        a, b = self._pair(a, b)
        return a + b

    def sub(self, a, b):
        a, b = self._pair(a, b)
        return a - b

    def mul(self, a, b):
        a, b = self._pair(a, b)
        return a * b

    def shr(self, a, n):
        a, n = self._pair(a, n)
        assert a.dtype == np.int32, "logical shifts are only used on i32"
        return (a.view(np.uint32) >> n.astype(np.uint32)).astype(np.int32)

    def bit_and(self, a, b):
        a, b = self._pair(a, b)
        return a & b

    def smin(self, a, b):
        a, b = self._pair(a, b)
        return np.minimum(a, b)

    def smax(self, a, b):
        a, b = self._pair(a, b)
        return np.maximum(a, b)

    def udiv(self, a, b):
        a, b = self._pair(a, b)
        return a // b

    def lt(self, a, b):
        a, b = self._pair(a, b)
        return a < b

    def eq(self, a, b):
        a, b = self._pair(a, b)
        return a == b

    def both(self, a, b):
        return np.logical_and(a, b)

    def true(self):
        return self._lanes(True, bool)

    def select(self, cond, a, b):
        if isinstance(a, (int, float)) or isinstance(b, (int, float)):
            a, b = self._pair(a, b)
        return np.where(cond if np.ndim(a) == 2 else cond[..., None], a, b)

    def to_i64(self, v):
        return self._int(v).astype(np.int64)

    def to_i32(self, v):
        return self._int(v).astype(np.int32)

    def uniform(self, v):
        return np.broadcast_to(self._int(v)[:, :1], self.shape)

    def thread_id(self):
        return (np.arange(self.waves, dtype=np.int32)[:, None] * WAVE_SIZE + np.arange(WAVE_SIZE, dtype=np.int32))

    def block_id(self, axis: int):
        return self._lanes(self.ids[axis])

    # ------------------------------------------------------------------ control
    def for_range(self, lower, upper, carried, body):
        bounds = [np.unique(self._int(v)[self.active]) for v in (lower, upper)]
        if any(b.size != 1 for b in bounds):
            raise EmulationFault("a loop's bounds must be the same for every active wave")
        for i in range(int(bounds[0][0]), int(bounds[1][0])):
            carried = body(self._lanes(i), carried)
        return carried

    def _wave_condition(self, cond) -> np.ndarray:
        cond = np.broadcast_to(np.asarray(cond, bool), self.shape)
        if (cond != cond[:, :1]).any():
            raise EmulationFault("a branch condition must be wave-uniform")
        return cond[:, 0]

    def _run_masked(self, waves, body):
        if not waves.any():
            return
        saved, self.active = self.active, waves
        try:
            body()
        finally:
            self.active = saved

    def if_then(self, cond, body):
        self._run_masked(self.active & self._wave_condition(cond), body)

    def if_value(self, cond, then_body, else_body):
        taken = self._wave_condition(cond)
        results = {}
        for side, waves, body in (("then", self.active & taken, then_body), ("else", self.active & ~taken, else_body)):
            self._run_masked(waves, lambda: results.__setitem__(side, body()))
        if len(results) == 1:
            return next(iter(results.values()))
        return np.where(taken[:, None], np.broadcast_to(results["then"], self.shape),
                        np.broadcast_to(results["else"], self.shape)).astype(np.float32)

    def sched_fence(self):
        pass

    def wait_vm_and_barrier(self):
        if not self.active.all():
            raise EmulationFault("a barrier inside a branch that not every wave takes (a hang on the GPU)")

    def wait_vm(self):
        pass

    # ------------------------------------------------------------------ memory
    def lds_allocate(self, nbytes: int):
        self.lds = np.full(nbytes, 0xCD, np.uint8)  # junk: unfilled bytes must never be used
        return self._lanes(0)

    def base_address(self, address: int):
        return self._lanes(address, np.int64)

    def buffer_resource(self, address, num_records):
        return _Resource(address, num_records, self.shape)

    def _buffer_read(self, rsrc: _Resource, offset, nbytes: int) -> np.ndarray:
        """Per-dword range check, as raw buffers do: out-of-range dwords read 0."""
        offset = self._int(offset).astype(np.int64)
        out = np.zeros((self.waves, WAVE_SIZE, nbytes), np.uint8)
        for dword in range(0, nbytes, 4):
            ok = offset + dword + 4 <= rsrc.num_records
            out[ok, dword:dword + 4] = self.memory.read(rsrc.address[ok] + offset[ok] + dword, 4)
        return out

    def scalar_load(self, rsrc, offset):
        """``s_buffer_load_dword``. Stricter than the hardware: a load past ``num_records`` (or
        before the descriptor's base) is a fault here, because the kernel is meant never to
        issue one (its table and lengths loads stay inside the row their descriptor covers)."""
        offset = self._int(offset)
        if (offset != offset[:, :1]).any():
            raise EmulationFault("a scalar load needs a wave-uniform offset")
        live = self.active[:, None] & np.ones_like(offset, bool)
        if ((offset < 0) | (offset.astype(np.int64) + 4 > rsrc.num_records))[live].any():
            raise EmulationFault(f"a scalar load past its descriptor (offset {offset[live].max()}, "
                                 f"num_records {rsrc.num_records[live].min()})")
        return self._buffer_read(rsrc, offset, 4).view(np.int32)[..., 0]

    def _with_soffset(self, rsrc, uniform_offset):
        """The resource as seen with ``soffset``: added to the address, not range-checked."""
        uniform_offset = self._int(uniform_offset)
        if (uniform_offset != uniform_offset[:, :1]).any():
            raise EmulationFault("soffset must be wave-uniform")
        return _Resource(rsrc.address + uniform_offset.astype(np.int64), rsrc.num_records, self.shape)

    def buffer_load_pair(self, rsrc, offset, uniform_offset=0):
        data = self._buffer_read(self._with_soffset(rsrc, uniform_offset), offset, 16)
        return [data[..., :8], data[..., 8:]]

    def buffer_load_i32(self, rsrc, offset):
        return self._buffer_read(rsrc, offset, 4).view(np.int32)[..., 0]

    def buffer_load_f32x4(self, rsrc, offset, uniform_offset=0):
        data = self._buffer_read(self._with_soffset(rsrc, uniform_offset), offset, 16).view(np.float32)
        return [data[..., i] for i in range(4)]

    def buffer_store_f32(self, value, rsrc, offset):
        offset = self._int(offset).astype(np.int64)
        ok = (offset + 4 <= rsrc.num_records) & self.active[:, None]
        values = np.ascontiguousarray(np.broadcast_to(value, self.shape).astype(np.float32))
        self.memory.write(rsrc.address[ok] + offset[ok], values[ok][:, None].view(np.uint8))
        if self.store_trace is not None:
            self.store_trace.append(rsrc.address[ok] + offset[ok])

    def buffer_store_bf16(self, value, rsrc, offset):
        offset = self._int(offset).astype(np.int64)
        ok = (offset + 2 <= rsrc.num_records) & self.active[:, None]
        values = torch.from_numpy(np.ascontiguousarray(np.broadcast_to(value, self.shape).astype(np.float32)))
        bits = values.to(torch.bfloat16).view(torch.int16).numpy()  # round to nearest even, as v_cvt does
        self.memory.write(rsrc.address[ok] + offset[ok], bits[ok][:, None].view(np.uint8))
        if self.store_trace is not None:
            self.store_trace.append(rsrc.address[ok] + offset[ok])

    def global_load_f32(self, address):
        return self.memory.read(np.asarray(address, np.int64), 4).view(np.float32)[..., 0]

    def global_load_i32(self, address):
        return self.memory.read(np.asarray(address, np.int64), 4).view(np.int32)[..., 0]

    def lds_dma(self, rsrc, lds_address, lane_offset, uniform_offset, nbytes):
        for name, value in (("M0", lds_address), ("soffset", uniform_offset)):
            value = self._int(value)
            if (value != value[:, :1]).any():
                raise EmulationFault(f"LDS DMA {name} must be wave-uniform")
        self._count("lds_dma")
        m0 = self.uniform(lds_address)
        lane = np.arange(WAVE_SIZE)
        data = self._buffer_read(self._with_soffset(rsrc, uniform_offset), lane_offset, nbytes)
        target = m0.astype(np.int64) + lane * nbytes
        if target.min() < 0 or target.max() + nbytes > self.lds.size:
            raise EmulationFault(f"LDS DMA past the allocation ({target.max()} + {nbytes} > {self.lds.size})")
        self.lds[target[self.active][..., None] + np.arange(nbytes)] = data[self.active]

    def lds_read_i32(self, address):
        address = self._int(address).astype(np.int64)
        if (address % 4).any() or address.min() < 0 or address.max() + 4 > self.lds.size:
            raise EmulationFault("misaligned or out-of-range ds_read_b32")
        return np.ascontiguousarray(self.lds[address[..., None] + np.arange(4)]).view(np.int32)[..., 0]

    def lds_read_pair(self, address):
        address = self._int(address).astype(np.int64)
        if (address % 16).any() or address.min() < 0 or address.max() + 16 > self.lds.size:
            raise EmulationFault("misaligned or out-of-range ds_read_b128")
        data = self.lds[address[..., None] + np.arange(16)]
        return [data[..., :8], data[..., 8:]]

    # ------------------------------------------------------------------ math
    def zero_f32(self):
        return self._lanes(0.0, np.float32)

    def zero_acc(self):
        return np.zeros((self.waves, WAVE_SIZE, 4), np.float32)

    def acc_element(self, acc, i):
        return acc[..., i]

    def _fp8(self, bytes_: np.ndarray) -> np.ndarray:
        return torch.from_numpy(np.ascontiguousarray(bytes_)).view(self.fp8).float().numpy()

    def _count(self, kind: str) -> None:
        for wave in np.flatnonzero(self.active):
            self.stats.by_wave[kind, int(wave)] += 1

    def mfma(self, a, b, acc):
        self.stats.mfma["v_mfma_f32_16x16x32_fp8_fp8"] += int(self.active.sum())
        self._count("mfma")
        lane = np.arange(WAVE_SIZE)
        row, group = lane % 16, lane // 16
        a_vals, b_vals = self._fp8(a), self._fp8(b)  # [wave, lane, 8]
        a_mat = np.zeros((self.waves, 16, 32), np.float32)
        b_mat = np.zeros((self.waves, 32, 16), np.float32)
        for e in range(8):
            a_mat[:, row, 8 * group + e] = a_vals[:, :, e]
            b_mat[:, 8 * group + e, row] = b_vals[:, :, e]
        d = a_mat @ b_mat  # [wave, 16, 16]
        out = acc.copy()
        for i in range(4):
            out[..., i] += d[:, 4 * group + i, row]
        return out

    def mfma_scaled(self, a_parts, b_parts, acc, scale_a, scale_b, operand_format="fp8"):
        self.stats.mfma["v_mfma_scale_f32_16x16x128_f8f6f4"] += int(self.active.sum())
        self._count("mfma")
        lane = np.arange(WAVE_SIZE)
        row, group = lane % 16, lane // 16
        decode = self._fp8 if operand_format == "fp8" else _e2m1
        operands = []
        for parts, scale in ((a_parts, scale_a), (b_parts, scale_b)):
            values = decode(np.concatenate(parts, axis=-1))  # [wave, lane, 32]
            byte = (self._int(scale) & 0xFF).astype(np.int32)
            with np.errstate(invalid="ignore", over="ignore"):
                factor = np.where(byte == 255, np.float32(np.nan), np.exp2((byte - 127).astype(np.float32)))
                operands.append((values * factor[..., None]).astype(np.float32))
        a_mat = np.zeros((self.waves, 16, 128), np.float32)
        b_mat = np.zeros((self.waves, 128, 16), np.float32)
        for e in range(32):
            if operand_format == "fp8":
                k = 16 * group + e if e < 16 else 64 + 16 * group + e - 16
            else:
                k = 32 * group + e
            a_mat[:, row, k] = operands[0][:, :, e]
            b_mat[:, k, row] = operands[1][:, :, e]
        with np.errstate(invalid="ignore", over="ignore"):  # NaN scales: NaN results, as on the GPU
            d = a_mat @ b_mat
        out = acc.copy()
        for i in range(4):
            out[..., i] += d[:, 4 * group + i, row]
        return out

    def byte_permute(self, hi, lo, selector):
        hi, lo, selector = (self._int(v) for v in (hi, lo, selector))
        source = np.concatenate([np.ascontiguousarray(np.broadcast_to(v, self.shape))[..., None].view(np.uint8)
                                 for v in (lo, hi)], axis=-1)  # [wave, lane, 8]: lo's bytes first
        picks = np.ascontiguousarray(np.broadcast_to(selector, self.shape))[..., None].view(np.uint8)
        if (picks > 7).any():
            raise EmulationFault("v_perm_b32 selectors above 7 (constant bytes) are not modelled")
        return np.ascontiguousarray(np.take_along_axis(source, picks.astype(np.int64), axis=-1)).view(np.int32)[..., 0]

    def i64_from_halves(self, lo, hi):
        return np.concatenate([np.ascontiguousarray(np.broadcast_to(self._int(v), self.shape))[..., None].view(np.uint8)
                               for v in (lo, hi)], axis=-1)

    def ldexp(self, x, n):
        with np.errstate(over="ignore", under="ignore"):
            return np.ldexp(np.asarray(x, np.float32), self._int(n)).astype(np.float32)

    def relu(self, x):
        return np.maximum(x, np.float32(0))

    def fma(self, a, b, c):
        return (a * b + c).astype(np.float32)

    def fmul(self, a, b):
        return (a * b).astype(np.float32)

    def fadd(self, a, b):
        return (a + b).astype(np.float32)

    def shuffle_up(self, value, delta: int):
        return np.broadcast_to(value, self.shape)[:, (np.arange(WAVE_SIZE) - delta) % WAVE_SIZE]

    def read_lane(self, value, lane: int):
        return np.broadcast_to(np.broadcast_to(value, self.shape)[:, lane:lane + 1], self.shape)

    def shuffle_xor(self, value, mask: int):
        return np.broadcast_to(value, self.shape)[:, np.arange(WAVE_SIZE) ^ mask]


def emulate(plan: KernelPlan, args: LaunchArgs, grid_x: int, trace_stores: bool = False) -> EmulationStats:
    """Run ``plan`` on ``args`` (CPU tensors) workgroup by workgroup over its whole grid
    (``algorithm.grid``), writing ``args.out``. ``grid_x``: persistent programs (balanced) or
    splits per sequence (split)."""
    memory = _Memory()
    values = list(launch_arguments(args, grid_x))
    for i in range(7):  # tensors -> addresses in the emulated address space
        values[i] = memory.tensor_address(values[i])
    named = dict(zip(ARG_NAMES, values))
    stats = EmulationStats()
    size_x, size_y = grid(plan, grid_x, args.problem.shape_key.batch)
    for y in range(size_y):
        for x in range(size_x):
            KernelBody(plan, EmulatedOps(plan, memory, x, y, stats, trace_stores), named).run()
    if trace_stores:  # byte addresses -> element indices of the output's storage
        out_base = named["out"]
        size = args.out.element_size()
        stats.stores = {ids: (np.concatenate(chunks) - out_base) // size if chunks else np.zeros(0, np.int64)
                        for ids, chunks in stats.stores.items()}
    return stats
