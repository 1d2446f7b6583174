"""The ``ops`` of ``algorithm.py`` as FlyDSL/MLIR builders: integer arithmetic on raw MLIR
values, AMD buffer resources, scalar/vector/LDS loads, the global->LDS DMA, the fp8 MFMA, the
stage loop. ``emulate.py`` implements the same names on NumPy lanes.

Why raw values instead of FlyDSL's layout algebra: every address in this kernel is a handful of
shifts and adds that must land in SGPRs when they are wave-uniform (page bases, block ids, row
lengths) and be 64-bit where they can pass 2^31 (KV pages, output rows). Writing them as plain
arith ops keeps that visible.

Imports flydsl: only ``kernel.py`` and the compile path import this module.
"""

# No ``from __future__ import annotations``: FlyDSL reads real annotation objects.

from flydsl._mlir import ir
from flydsl._mlir.dialects import arith, gpu, llvm, math, rocdl, scf, vector
from flydsl._mlir.dialects import fly as fly_dialect
import flydsl.expr as fx
from flydsl.expr import rocdl as fx_rocdl

# Buffer resource word 3 on CDNA (gfx9): DATA_FORMAT=32 bit, NUM_FORMAT=float; raw buffer
# (stride 0), so the hardware range check is ``offset < num_records`` and an out-of-range
# load returns 0 / an out-of-range store is dropped. The kernel relies on that for masking.
_BUFFER_FLAGS = (7 << 12) | (4 << 15)
#: a buffer offset no num_records reaches: stores with it are dropped
OUT_OF_RANGE = 0x7FFFFFFF


def i32_type():
    return ir.IntegerType.get_signless(32)


def i64_type():
    return ir.IntegerType.get_signless(64)


def f32_type():
    return ir.F32Type.get()


def vec_type(n, elem):
    return ir.VectorType.get([n], elem)


def _raw(v, like=None):
    """An ``ir.Value`` from a value, a FlyDSL numeric or a Python int (typed like ``like``)."""
    if isinstance(v, ir.Value):
        return v
    if isinstance(v, bool):
        return arith.constant(ir.IntegerType.get_signless(1), int(v))
    if isinstance(v, int):
        return arith.constant(like.type if like is not None else i32_type(), v)
    if isinstance(v, float):
        return arith.constant(f32_type(), v)
    return fx.as_ir_value(v)


def _pair(a, b):
    if isinstance(a, int) and not isinstance(b, int):
        b = _raw(b)
        return _raw(a, b), b
    a = _raw(a)
    return a, _raw(b, a)


def const32(v):
    return arith.constant(i32_type(), v)


def add(a, b):
    return arith.addi(*_pair(a, b))


def sub(a, b):
    return arith.subi(*_pair(a, b))


def mul(a, b):
    return arith.muli(*_pair(a, b))


def shr(a, n):
    """Logical shift right (the operands here are never negative)."""
    return arith.shrui(*_pair(a, n))


def bit_and(a, b):
    return arith.andi(*_pair(a, b))


def smin(a, b):
    return arith.minsi(*_pair(a, b))


def smax(a, b):
    return arith.maxsi(*_pair(a, b))


def udiv(a, b):
    """Unsigned quotient (i32 or i64; the operands here are never negative)."""
    return arith.divui(*_pair(a, b))


def lt(a, b):
    return arith.cmpi(arith.CmpIPredicate.slt, *_pair(a, b))


def eq(a, b):
    return arith.cmpi(arith.CmpIPredicate.eq, *_pair(a, b))


def both(a, b):
    return arith.andi(_raw(a), _raw(b))


def select(cond, a, b):
    a, b = _pair(a, b)
    return arith.select(_raw(cond), a, b)


def to_i64(v):
    """Sign-extend an i32 to i64 (64-bit address arithmetic)."""
    v = _raw(v)
    return v if v.type == i64_type() else arith.extsi(i64_type(), v)


def to_i32(v):
    """Truncate an i64 to i32."""
    return arith.trunci(i32_type(), _raw(v))


def uniform(v):
    """Force a wave-uniform i32 into an SGPR (``v_readfirstlane``)."""
    return rocdl.readfirstlane(i32_type(), _raw(v))


def thread_id():
    return _raw(fx.Int32(fx.thread_idx.x))


def block_id(axis: int):
    return _raw(fx.Int32(fx.block_idx.x if axis == 0 else fx.block_idx.y))


def for_range(lower, upper, carried, body):
    """``for i in [lower, upper): carried = body(i, carried)`` as an ``scf.for`` (i32 bounds);
    returns the final carried values."""
    loop = scf.ForOp(_raw(lower), _raw(upper), const32(1), list(carried))
    with ir.InsertionPoint(loop.body):
        scf.YieldOp(list(body(loop.induction_variable, list(loop.body.arguments[1:]))))
    return list(loop.results)


def _if(cond, then_body, else_body):
    op = scf.IfOp(_raw(cond), [], has_else=else_body is not None)
    with ir.InsertionPoint(op.then_block):
        then_body()
        scf.YieldOp([])
    if else_body is not None:
        with ir.InsertionPoint(op.else_block):
            else_body()
            scf.YieldOp([])


def if_value(cond, then_body, else_body):
    """``then_body()`` or ``else_body()`` (one f32 each) by a wave-uniform ``cond``."""
    op = scf.IfOp(_raw(cond), [f32_type()], has_else=True)
    with ir.InsertionPoint(op.then_block):
        scf.YieldOp([_raw(then_body())])
    with ir.InsertionPoint(op.else_block):
        scf.YieldOp([_raw(else_body())])
    return op.results[0]


def if_then(cond, body):
    """``if cond: body()`` (``cond`` wave-uniform: a scalar branch)."""
    _if(cond, body, None)


def sched_fence():
    """Stop the scheduler from moving instructions across this point."""
    fx_rocdl.sched_barrier(0)


# ----------------------------------------------------------------------------- memory
def lds_allocate(nbytes: int):
    """Static LDS of ``nbytes``; returns its byte address (i32)."""
    storage = fx.SharedAllocator().allocate(nbytes).peek()
    return llvm.ptrtoint(i32_type(), fx.to_llvm_ptr(storage.ptr))


def base_address(tensor):
    """Device address (i64) of a kernel tensor argument's first element."""
    ptr = fly_dialect.extract_aligned_pointer_as_index(ir.Type.parse("!llvm.ptr"), _raw(tensor))
    return llvm.ptrtoint(i64_type(), ptr)


def buffer_resource(address, num_records):
    """Raw buffer resource over ``[address, address + num_records)`` bytes (i64 address).

    A 64-bit base in the descriptor is how KV pages and output rows past 2^31 bytes are reached:
    the per-lane offsets stay small and 32-bit.
    """
    ptr = llvm.inttoptr(ir.Type.parse("!llvm.ptr"), _raw(address))
    stride = arith.constant(ir.IntegerType.get_signless(16), 0)
    return rocdl.MakeBufferRsrcOp(ir.Type.parse("!llvm.ptr<8>"), ptr, stride, to_i64(num_records),
                                  const32(_BUFFER_FLAGS)).result


def scalar_load(resource, byte_offset):
    """One i32 through the scalar cache (``s_buffer_load_dword``); the offset must be uniform.
    Out of range reads 0."""
    words = llvm.bitcast(vec_type(4, i32_type()), llvm.ptrtoint(ir.IntegerType.get_signless(128), resource))
    return llvm.call_intrinsic(i32_type(), "llvm.amdgcn.s.buffer.load.i32", [words, _raw(byte_offset), const32(0)],
                               [], [])


def _buffer_load(resource, byte_offset, result_type, uniform_offset=0):
    """Per-lane buffer load (``buffer_load_dword*``); out of range reads 0. ``uniform_offset``
    rides in soffset: outside the range check, and one SGPR instead of a VGPR per load."""
    return rocdl.RawPtrBufferLoadOp(result_type, resource, _raw(byte_offset), _raw(uniform_offset)).result


def buffer_load_pair(resource, byte_offset, uniform_offset=0):
    """16 bytes per lane as two i64 (two MFMA fp8 operands of 8 bytes)."""
    pair = llvm.bitcast(vec_type(2, i64_type()),
                        _buffer_load(resource, byte_offset, vec_type(4, i32_type()), uniform_offset))
    return [_element(pair, 0), _element(pair, 1)]


def buffer_load_i32(resource, byte_offset):
    """One i32 per lane (``buffer_load_dword``); out of range reads 0."""
    return _buffer_load(resource, byte_offset, i32_type())


def buffer_load_f32x4(resource, byte_offset, uniform_offset=0):
    """4 consecutive fp32 per lane."""
    v = _buffer_load(resource, byte_offset, vec_type(4, f32_type()), uniform_offset)
    return [_element(v, i) for i in range(4)]


def buffer_store_f32(value, resource, byte_offset):
    """Per-lane buffer store; an offset at or past num_records is dropped by the hardware."""
    rocdl.RawPtrBufferStoreOp(_raw(value), resource, _raw(byte_offset), const32(0))


def buffer_store_bf16(value, resource, byte_offset):
    """An fp32 rounded to bf16 (to nearest even) and stored as 2 bytes (``buffer_store_short``);
    dropped like :func:`buffer_store_f32` out of range."""
    rounded = arith.truncf(ir.BF16Type.get(), _raw(value))
    bits = arith.bitcast(ir.IntegerType.get_signless(16), rounded)
    rocdl.RawPtrBufferStoreOp(bits, resource, _raw(byte_offset), const32(0))


def global_load_f32(address):
    """One fp32 at a per-lane 64-bit address (``global_load_dword``)."""
    ptr = llvm.inttoptr(ir.Type.parse("!llvm.ptr<1>"), _raw(address))
    return llvm.LoadOp(f32_type(), ptr, alignment=4).result


def global_load_i32(address):
    """One i32 at a per-lane 64-bit address (``global_load_dword``)."""
    ptr = llvm.inttoptr(ir.Type.parse("!llvm.ptr<1>"), _raw(address))
    return llvm.LoadOp(i32_type(), ptr, alignment=4).result


def lds_read_pair(address):
    """16 bytes from LDS (``ds_read_b128``) as two i64 MFMA operands."""
    ptr = llvm.inttoptr(ir.Type.parse("!llvm.ptr<3>"), _raw(address))
    pair = llvm.LoadOp(vec_type(2, i64_type()), ptr, alignment=16).result
    return [_element(pair, 0), _element(pair, 1)]


def lds_read_i32(address):
    """4 bytes from LDS (``ds_read_b32``)."""
    ptr = llvm.inttoptr(ir.Type.parse("!llvm.ptr<3>"), _raw(address))
    return llvm.LoadOp(i32_type(), ptr, alignment=4).result


def lds_dma(resource, lds_address_uniform, lane_offset, uniform_offset, nbytes):
    """Asynchronous global->LDS copy: lane ``l`` moves ``nbytes`` from
    ``resource + uniform_offset + lane_offset`` to LDS ``lds_address_uniform + l * nbytes``
    (``buffer_load_dword[x4] v, s[rsrc], s_off offen lds``).

    The uniform part rides in soffset, which only the memory address sees. The instruction's
    immediate offset is left at 0: on CDNA it is added to the memory address *and* to the LDS
    address (``LDS = M0 + inst_offset + lane * nbytes``).

    Written as inline asm on purpose: given the intrinsic, LLVM cannot tell the stage being
    filled from the stage being read and waits for the copy (``s_waitcnt vmcnt(0)``) before every
    LDS read, which serialises the double buffer. As asm the copy is invisible to its wait
    insertion; the kernel waits for it explicitly (``s_waitcnt vmcnt(0)`` + barrier) before the
    stage is read. ``s_nop 0``: one wait state between writing M0 and the LDS DMA reading it.
    """
    op = {4: "buffer_load_dword", 16: "buffer_load_dwordx4"}[nbytes]
    llvm.inline_asm(None, [_raw(lds_address_uniform), _raw(lane_offset), resource, _raw(uniform_offset)],
                    f"s_mov_b32 m0, $0\n\ts_nop 0\n\t{op} $1, $2, $3 offen lds", "s,v,s,s,~{m0}",
                    has_side_effects=True)


def wait_vm_and_barrier():
    """All of this wave's copies landed, then every wave's (``s_waitcnt vmcnt(0)`` + barrier)."""
    wait_vm()
    gpu.barrier()


def wait_vm():
    fx_rocdl.s_waitcnt(vmcnt=0)


# ----------------------------------------------------------------------------- math
def _element(v, i):
    return llvm.extractelement(_raw(v), const32(i))


def zero_f32():
    return _raw(0.0)


def zero_acc():
    return _raw(fx.Vector.filled(4, 0.0, fx.Float32))


def acc_element(acc, i):
    return _element(acc, i)


def mfma(a, b, acc):
    """``v_mfma_f32_16x16x32_fp8_fp8``: A = 16 rows x 32 fp8 (i64 per lane), B = 32 x 16 columns,
    acc 4 fp32 per lane (row ``4 * (lane // 16) + i``, column ``lane % 16``). The fp8 flavour is
    the arch's: e4m3fnuz on gfx942, e4m3fn (OCP) on gfx950."""
    return fx_rocdl.mfma_f32_16x16x32_fp8_fp8(vec_type(4, f32_type()), [_raw(a), _raw(b), _raw(acc), 0, 0, 0])


#: the scaled MFMA's operand format codes (its cbsz / blgp fields): fp8 e4m3 and fp4 e2m1
MFMA_OPERAND_FORMAT = {"fp8": 0, "fp4": 4}


def _operand_bytes(parts):
    """8-byte MFMA operands as the scaled MFMA's operand vector: four (k-steps 0..3 of fp8,
    ``vector<8xi32>``) or two (32 packed fp4 codes, ``vector<4xi32>``)."""
    v = vector.from_elements(vec_type(len(parts), i64_type()), [_raw(x) for x in parts])
    return llvm.bitcast(vec_type(2 * len(parts), i32_type()), v)


def mfma_scaled(a_parts, b_parts, acc, scale_a, scale_b, operand_format="fp8"):
    """``v_mfma_scale_f32_16x16x128_f8f6f4`` with A and B in ``operand_format``: fp8 e4m3 (a
    lane's 32 bytes are the four k-steps of :func:`mfma` in order) or fp4 e2m1 (a lane's 16
    bytes are 32 codes, the low nibble first); ``scale_a``/``scale_b`` (an int or an i32 value)
    hold the e8m0 scale byte of the lane's 32 elements in byte 0 (opsel 0; the rest is ignored)."""
    fmt = MFMA_OPERAND_FORMAT[operand_format]
    scales = [const32(s) if isinstance(s, int) else _raw(s) for s in (scale_a, scale_b)]
    return fx_rocdl.mfma_scale_f32_16x16x128_f8f6f4(
        vec_type(4, f32_type()),
        [_operand_bytes(a_parts), _operand_bytes(b_parts), _raw(acc), fmt, fmt, 0, scales[0], 0, scales[1]])


def byte_permute(hi, lo, selector):
    """``v_perm_b32``: byte ``i`` of the result is byte ``selector.byte[i]`` (0..7) of the 8 bytes
    ``hi:lo`` (0..3 from ``lo``)."""
    return llvm.call_intrinsic(i32_type(), "llvm.amdgcn.perm", [_raw(hi), _raw(lo), _raw(selector)], [], [])


def i64_from_halves(lo, hi):
    """Two i32 as one i64 MFMA operand (``lo`` its bytes 0..3)."""
    return llvm.bitcast(i64_type(), vector.from_elements(vec_type(2, i32_type()), [_raw(lo), _raw(hi)]))


def ldexp(x, n):
    """``x * 2^n`` (``v_ldexp_f32``): exact where the result is a normal fp32."""
    return llvm.call_intrinsic(f32_type(), "llvm.ldexp.f32.i32", [_raw(x), _raw(n)], [], [])


def true():
    return _raw(True)


def relu(x):
    """``max(x, 0)``; ``nnan`` spares the NaN-canonicalising ``v_max_f32 x, x, x`` (scores of
    finite fp8 are finite; a NaN could only come from bytes whose logits are never stored)."""
    return arith.maxnumf(_raw(x), _raw(0.0), fastmath=arith.FastMathFlags.nnan)


def fma(a, b, c):
    return math.fma(_raw(a), _raw(b), _raw(c))


def fmul(a, b):
    return arith.mulf(_raw(a), _raw(b))


def fadd(a, b):
    return arith.addf(_raw(a), _raw(b))


def shuffle_up(value, delta):
    """Lane ``l`` reads ``value`` of lane ``l - delta`` (lanes ``< delta``: unspecified)."""
    return gpu.ShuffleOp(_raw(value), const32(delta), const32(64), mode="up").shuffleResult


def read_lane(value, lane):
    """``value`` of lane ``lane`` (a constant) as a wave-uniform i32 (``v_readlane_b32``)."""
    return rocdl.readlane(i32_type(), _raw(value), const32(lane))


def shuffle_xor(value, mask):
    """Lane ``l`` reads ``value`` of lane ``l ^ mask`` (wave64)."""
    return gpu.ShuffleOp(_raw(value), const32(mask), const32(64), mode="xor").shuffleResult
