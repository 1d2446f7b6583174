"""The paged MQA logits kernel body for gfx942 / gfx950 (see ``plan.py`` for the work split).

Written once against a small ``ops`` interface: ``ir.py`` emits it as FlyDSL/MLIR (the real
kernel), ``emulate.py`` runs the same code on NumPy lanes (CPU checks of its index math).

A workgroup (4 waves) walks *segments*: runs of ChunkK-token stages of one sequence. Which ones
is the ``Schedule`` (``paged_mqa_logits/schedule.py`` is the model both follow):

* ``balanced``: workgroup ``p`` of a persistent grid of ``P`` takes the (sequence, stage) items
  ``[total * p // P, total * (p + 1) // P)``. Every wave computes that share itself from the
  device lengths (``balanced_share``: lane-parallel tile counts, a wave prefix sum, three wave
  reductions; no LDS, no barrier), then walks the sequences it touches, skipping empty ones;
* ``split``: workgroup ``(s, b)`` takes stages ``[n * s // S, n * (s + 1) // S)`` of sequence
  ``b``'s ``n`` stages (one segment).

Lane ``l`` of a wave: ``c = l % 16`` (MFMA row of A = head, column of B = token), ``g = l // 16``
(lane quarter).

Data layouts, chosen once here:

* **LDS stage** = ChunkK tokens in the Preshuffle tile order: token ``t``, dim ``d`` at byte
  ``(t // 16) * 2048 + (d // 16) * 256 + (t % 16) * 16 + d % 16``. A preshuffled cache block
  already is this image, so its DMA is a straight copy; for the plain layout the DMA lanes fetch
  the matching 16-byte pieces instead (the LDS image is the same either way).
* **MFMA operands** (``v_mfma_f32_16x16x32_fp8_fp8``): the dims a lane feeds for k-step
  ``ks = 2p + h`` are ``64p + 16g + 8h + (0..7)``. Any assignment works as long as A (Q) and B
  (K) use the same one; this one makes every lane's bytes for two k-steps one contiguous 16-byte
  piece, so B is two ``ds_read_b128`` per tile and Q two 16-byte loads per 16 heads. The scaled
  ``v_mfma_scale_f32_16x16x128_f8f6f4`` (``Mfma=f8f6f4``, gfx950) takes a lane's 32 bytes of all
  four k-steps at once, in that order (dims ``16g + (0..15)``, then ``64 + 16g + (0..15)``), with
  neutral e8m0 scales: one instruction per (16 heads, 16 tokens) instead of four.
* **MXFP4** (``kv_format="fp4"``, gfx950): a token's key is 64 bytes of packed e2m1 pairs, so
  the stage (and a tile, 1 KiB) is the same image at half the width: token ``t``, byte ``d`` at
  ``(t // 16) * 1024 + (d // 16) * 256 + (t % 16) * 16 + d % 16``. Lane quarter ``g`` feeds the
  scaled MFMA bytes ``16g..16g+15`` of its head / token, i.e. dims ``32g..32g+31``: exactly
  MXFP4 group ``g``, so the lane's e8m0 block scale is that group's exponent (byte ``g`` of
  ``q_scale[b, j, h]`` for A, of the token's exponent word after the block's keys for B) and
  the instruction computes ``sum_g 2^(eq_g + ek_g - 254) * dot_g`` itself. Whatever order the
  hardware gives the four lane quarters' K blocks, A and B use the same one and each lane's
  32 codes share one exponent, so the product is the same. No per-token fp32 scale follows.
* **Rows**: wave ``w`` owns rows ``rg, rg + row_groups, ...`` (``rg = w % row_groups``). Where
  ``next_n`` leaves some waves' last row slot empty (3, 5..7), those waves branch around that
  slot's MFMAs (per tile) and its reduction and store (per tile group), wave-uniform: no work
  on zeros, and one copy of the stage body (a second body without the slot spilled h64
  next_n 7 at WavePerEU 2).
* **MFMA result**: lane (c, g) holds ``S[head 16m + 4g + i, token 16t + c]``, i < 4; the head
  sum is 4 in-register terms per 16 heads, then across the 4 lane quarters.
* **Head reduction across quarters**: a reduce-scatter of up to 4 tiles (``_reduce_tiles``), so
  each lane ends with the full sum of one token and the wave stores 64 consecutive floats.

Masking and 64-bit addressing go through buffer resources: every KV page and every output row
gets its own descriptor with a 64-bit base, per-lane offsets stay 32-bit, and ``num_records``
bounds them (out-of-range reads give 0, out-of-range stores are dropped). An output row's
``num_records`` is its visible length, so positions a row may not see are never written.
"""

import torch

from ...schedule import BALANCED
from .plan import TILE, WAVE_SIZE, WAVES, KernelPlan

#: e8m0 exponent 127 = 2^0: the scaled MFMA's scales leave the fp8 products as they are
NEUTRAL_SCALE = 127
#: lengths each lane loads per round of the schedule's scan (independent loads in flight)
SCAN_UNROLL = 4
#: the chip's fp8 bytes of the e2m1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (codes 0..7), as the
#: (high, low) words of a ``v_perm_b32`` byte table: e4m3fnuz (bias 8) on gfx942, e4m3fn
#: (bias 7) on gfx950; every one of them is exact in both
E2M1_AS_FP8 = {"gfx942": (0x54504C48, 0x44403800), "gfx950": (0x4C484440, 0x3C383000)}
#: the two ue8m0 biases of a product of a query and a key exponent
EXPONENT_BIAS_2 = 254


def _signed32(v: int) -> int:
    """An unsigned 32-bit constant as the i32 of the same bits."""
    return v - (1 << 32) if v >= 1 << 31 else v


def _log2(n: int) -> int:
    assert n & (n - 1) == 0, n
    return n.bit_length() - 1


def _pick(I, values, index):
    """``values[index]`` for a runtime ``index`` (uniform: s_cselect chain; per lane: v_cndmask)."""
    result = values[0]
    for k in range(1, len(values)):
        result = I.select(I.eq(index, k), values[k], result)
    return result


class KernelBody:
    """One workgroup's program: the plan, the ``ops`` it is expressed in, the kernel arguments
    (by :data:`ARG_NAMES`) and the per-wave quantities derived once in the prologue. Methods
    bind ``I = self.ops``: every instruction goes through it."""

    def __init__(self, plan: KernelPlan, ops, args: dict):
        self.p = plan
        self.a = args
        self.ops = ops
        self._thread_values(plan.threads - 1)

    def _thread_values(self, thread_mask):
        """Everything derived from the thread id (``thread_id & thread_mask``): lane, ``c``,
        ``g``, wave (its index among the waves of its role), role, row group, token group, the
        DMA lane offset.

        The balanced schedule recomputes them per segment from a mask the compiler cannot fold
        (``min(b + 255, 255)`` = 255 for a sequence index ``b >= 0``): otherwise LICM hoists
        every per-lane and per-wave offset of the segment body out of the segment loop, and
        keeping them live across it spilled the widest shapes. Recomputed, they live exactly as
        long as in a single-segment kernel."""
        I = self.ops
        p = self.p
        tid = I.bit_and(I.thread_id(), thread_mask)
        self.lane = I.bit_and(tid, WAVE_SIZE - 1)
        self.c = I.bit_and(self.lane, 15)
        self.g = I.shr(self.lane, 4)
        wave = I.uniform(I.shr(tid, 6))
        # WaveRoles=split: waves 0..3 score (consumers), waves 4..7 copy (producers), and both
        # halves index their part of a stage by wave & 3; None: every wave does both
        self.producer = self.consumer = None
        if p.wave_roles == "split":
            self.producer, self.consumer = I.lt(WAVES - 1, wave), I.lt(wave, WAVES)
            wave = I.bit_and(wave, WAVES - 1)
        self.wave = wave
        self.rg = I.bit_and(wave, p.row_groups - 1)  # row group: rows rg, rg + row_groups, ...
        self.tg = I.shr(wave, _log2(p.row_groups))  # token group: tiles [tg * nt, (tg + 1) * nt)
        # wave-uniform: whether this wave's last row slot holds a real row (None: every wave's does)
        self.last_slot_real = I.lt(self.rg, p.full_row_groups) if p.full_row_groups < p.row_groups else None
        self.dma_lane_offset = self._dma_lane_part()

    # ------------------------------------------------------------------ lengths
    def lens_resource(self):
        """One descriptor over the whole lengths tensor (``[B, 1]`` view of 1-D lengths, or 2-D)."""
        I = self.ops
        a = self.a
        last = I.add(I.mul(I.sub(a["batch"], 1), a["stride_lens_b"]), I.mul(a["stride_lens_j"], self.p.next_n - 1))
        self.lens_rsrc = I.buffer_resource(I.base_address(a["lens"]), I.mul(I.add(last, 1), 4))

    def sequence_length(self, b, load):
        """The work size of sequence ``b``: ``lens[b]`` (1-D) or ``max_j lens[b, j]`` (2-D, never
        ``lens[b, 0]`` alone), at least 0. ``load(resource, byte offset)`` is a scalar load for a
        uniform ``b``, a per-lane load for one ``b`` per lane."""
        I = self.ops
        p, a = self.p, self.a
        row = I.mul(b, a["stride_lens_b"])
        if not p.lens_2d:
            return I.smax(load(self.lens_rsrc, I.mul(row, 4)), 0)
        seq_len = I.const32(0)
        for j in range(p.next_n):
            seq_len = I.smax(seq_len, load(self.lens_rsrc, I.mul(I.add(row, I.mul(a["stride_lens_j"], j)), 4)))
        return seq_len

    def visible_end(self, seq_len):
        """The last token + 1 any row of the sequence may see: clipped to ``max_model_len`` and to
        the block table's width (entries past it do not exist)."""
        I = self.ops
        width = I.mul(self.a["max_blocks"], self.p.kv_block_size)
        return I.smin(I.smin(seq_len, self.a["max_model_len"]), width)

    def stage_count(self, end):
        """Work items (ChunkK-token stages) of a sequence whose visible end is ``end``."""
        I = self.ops
        return I.shr(I.add(end, self.p.chunk_k - 1), _log2(self.p.chunk_k))

    def row_length(self, j):
        """Visible length of row ``j`` (uniform, ``j < next_n``) of the current sequence before the
        ``end`` clamp."""
        I = self.ops
        p, a = self.p, self.a
        if p.lens_2d:
            offset = I.mul(I.add(I.mul(self.b, a["stride_lens_b"]), I.mul(a["stride_lens_j"], j)), 4)
            return I.smax(I.scalar_load(self.lens_rsrc, offset), 0)
        return I.smax(I.add(self.seq_len, I.sub(j, p.next_n - 1)), 0)

    # ------------------------------------------------------------------ schedules
    def split_schedule(self):
        """``Schedule=split``: workgroup ``(s, b)`` walks stages ``[n*s//S, n*(s+1)//S)`` of
        sequence ``b`` (``schedule.split_segments``)."""
        I = self.ops
        split, b, splits = I.block_id(0), I.block_id(1), self.a["grid_x"]
        seq_len = self.sequence_length(b, I.scalar_load)
        end = self.visible_end(seq_len)
        stages = self.stage_count(end)
        c0 = I.udiv(I.mul(stages, split), splits)
        c1 = I.udiv(I.mul(stages, I.add(split, 1)), splits)
        # no segment for an empty split: its prologue would read the table of a row with no
        # visible token (possibly a zero-width table)
        I.if_then(I.lt(c0, c1), lambda: self.segment(b, seq_len, end, c0, c1))

    def balanced_share(self):
        """``Schedule=balanced``: this workgroup's items ``[start, stop)`` of the batch's ``total``
        and where they begin: the first sequence ``seq_first`` holding one of them, the items
        before it (``cum_first``) and ``seq_end`` (one past the last such sequence; ``seq_first``
        when the share is empty). All wave-uniform, computed by every wave from the device
        lengths, so a graph replay with new lengths gets a new schedule.

        Lane ``l`` owns sequences ``[l*R, (l+1)*R)``, ``R`` = ``ceil(B / 64)`` rounded up to the
        unroll: pass 1 sums their stage counts (a wave prefix sum gives each lane's offset and
        the total); pass 2 walks them again from that offset counting the sequences whose
        inclusive prefix is ``<= start`` (= the index of the sequence holding item ``start``) and
        ``< stop`` (= the index of the one holding ``stop - 1``)."""
        I = self.ops
        a = self.a
        # shifts of the scalar argument, not arith.ceildivui: LLVM lowers that with a VALU
        # carry-out, which put the lengths descriptor in VGPRs (a readfirstlane waterfall loop
        # around every lengths load); batch < 2^31 - 64, so the adds cannot wrap
        per_lane = I.mul(I.shr(I.add(I.shr(I.add(a["batch"], WAVE_SIZE - 1), _log2(WAVE_SIZE)), SCAN_UNROLL - 1),
                               _log2(SCAN_UNROLL)), SCAN_UNROLL)
        first_seq = I.mul(self.lane, per_lane)

        def stages_of(b):  # per lane; 0 past the batch
            valid = I.lt(b, a["batch"])

            def load(rsrc, offset):
                return I.buffer_load_i32(rsrc, I.select(valid, offset, I.OUT_OF_RANGE))

            return self.stage_count(self.visible_end(self.sequence_length(b, load))), valid

        def count(k, carried):
            (own,) = carried
            for u in range(SCAN_UNROLL):
                own = I.add(own, stages_of(I.add(first_seq, I.add(I.mul(k, SCAN_UNROLL), u)))[0])
            return [own]

        rounds = I.shr(per_lane, _log2(SCAN_UNROLL))
        (own,) = I.for_range(I.const32(0), rounds, [I.const32(0)], count)
        inclusive = self._wave_inclusive_sum(own)
        total = I.read_lane(inclusive, WAVE_SIZE - 1)
        program, programs = I.block_id(0), a["grid_x"]
        # total * p passes 2^31 for long batches on large chips: 64-bit product and quotient
        start = I.to_i32(I.udiv(I.mul(I.to_i64(total), I.to_i64(program)), I.to_i64(programs)))
        stop = I.to_i32(I.udiv(I.mul(I.to_i64(total), I.to_i64(I.add(program, 1))), I.to_i64(programs)))

        def locate(k, carried):
            cum, upto_start, cum_first, before_stop = carried
            for u in range(SCAN_UNROLL):
                n, valid = stages_of(I.add(first_seq, I.add(I.mul(k, SCAN_UNROLL), u)))
                cum = I.add(cum, n)
                at_or_before = I.both(valid, I.lt(cum, I.add(start, 1)))
                upto_start = I.add(upto_start, I.select(at_or_before, 1, 0))
                cum_first = I.select(at_or_before, cum, cum_first)
                before_stop = I.add(before_stop, I.select(I.both(valid, I.lt(cum, stop)), 1, 0))
            return [cum, upto_start, cum_first, before_stop]

        zero = I.const32(0)
        _, upto_start, cum_first, before_stop = I.for_range(
            zero, rounds, [I.sub(inclusive, own), zero, zero, zero], locate)
        seq_first = I.uniform(self._wave_reduce(upto_start, I.add))
        cum_first = I.uniform(self._wave_reduce(cum_first, I.smax))
        seq_end = I.select(I.lt(start, stop), I.add(I.uniform(self._wave_reduce(before_stop, I.add)), 1), seq_first)
        return start, stop, seq_first, cum_first, seq_end

    def balanced_schedule(self):
        """Walk the sequences of this workgroup's share: one segment per non-empty one."""
        I = self.ops
        start, stop, seq_first, cum_first, seq_end = self.balanced_share()

        def visit(seq, carried):
            (cum,) = carried  # items of the sequences before ``seq``
            seq_len = self.sequence_length(seq, I.scalar_load)
            end = self.visible_end(seq_len)
            stages = self.stage_count(end)
            c0 = I.smax(I.sub(start, cum), 0)
            c1 = I.smin(I.sub(stop, cum), stages)
            I.if_then(I.lt(c0, c1), lambda: self.segment(seq, seq_len, end, c0, c1))
            return [I.add(cum, stages)]

        I.for_range(seq_first, seq_end, [cum_first], visit)

    def _wave_inclusive_sum(self, x):
        """Inclusive prefix sum over the wave's lanes (i32)."""
        I = self.ops
        for delta in (1, 2, 4, 8, 16, 32):
            x = I.add(x, I.select(I.lt(self.lane, delta), 0, I.shuffle_up(x, delta)))
        return x

    def _wave_reduce(self, x, combine):
        """``combine`` over the wave's 64 lanes, the result in every lane (butterfly)."""
        I = self.ops
        for mask in (32, 16, 8, 4, 2, 1):
            x = combine(x, I.shuffle_xor(x, mask))
        return x

    # ------------------------------------------------------------------ the wave's rows
    def load_rows(self):
        """Per row slot r: validity, output descriptor, Q fragments and weights (registers)."""
        I = self.ops
        p, a = self.p, self.a
        q_base, w_base, out_base = (I.base_address(a[k]) for k in ("q", "weights", "out"))
        self.rows = []
        for r in range(p.rows_per_wave):
            j = I.add(self.rg, p.row_groups * r)
            valid = I.lt(j, p.next_n)
            j_safe = I.smin(j, p.next_n - 1)
            visible = I.select(valid, I.smin(self.row_length(j_safe), self.end), 0)
            out_row = I.add(I.mul(self.b, p.next_n), j_safe)
            size = p.logits_bytes
            out_rsrc = I.buffer_resource(
                I.add(out_base, I.mul(I.mul(I.to_i64(out_row), I.to_i64(a["stride_out"])), size)), I.mul(visible, size))
            q_row = I.add(q_base, I.add(I.mul(I.to_i64(self.b), I.to_i64(a["stride_q_b"])),
                                         I.mul(I.to_i64(j_safe), I.to_i64(a["stride_q_j"]))))
            q_rsrc = I.buffer_resource(q_row, I.select(valid, I.add(I.mul(a["stride_q_h"], p.heads - 1),
                                                                     p.key_row_bytes), 0))
            w_rsrc = I.buffer_resource(I.add(w_base, I.mul(I.mul(I.to_i64(out_row), I.to_i64(a["stride_w"])), 4)),
                                       I.select(valid, 4 * p.heads, 0))
            q_frags, weights = [], []
            for m in range(p.m_tiles):
                # head 16m + c: the 16m part is uniform (soffset), so the per-lane offsets are the
                # same few VGPRs for every m (and for every segment: nothing new stays live)
                q_heads = I.uniform(I.mul(a["stride_q_h"], 16 * m))
                frags = []
                # fp8: dims 64*half + 16g + (0..15) -> k-steps 2*half, 2*half + 1; fp4: the one
                # 16-byte half holds dims 32g + (0..31), MXFP4 group g
                for half in range(2 if p.kv_format == "fp8" else 1):
                    off = I.add(I.mul(self.c, a["stride_q_h"]), I.add(I.mul(self.g, 16), 64 * half))
                    frags += I.buffer_load_pair(q_rsrc, off, q_heads)
                q_frags.append(frags)
                weights.append(I.buffer_load_f32x4(w_rsrc, I.mul(self.g, 16), 64 * m))
            row = dict(out=out_rsrc, q=q_frags, w=weights)
            if p.kv_format == "fp4" and p.mfma == "fp8":
                row["q"], row["q_words"] = self._widened_query(q_rsrc, j_safe, valid)
            elif p.kv_format == "fp4":
                row["q_exponents"] = self._query_exponents(j_safe, valid)
            self.rows.append(row)

    def _query_scale_resource(self, j, valid):
        I = self.ops
        p, a = self.p, self.a
        row = I.add(I.mul(self.b, a["stride_qs_b"]), I.mul(j, a["stride_qs_j"]))
        return I.buffer_resource(I.add(I.base_address(a["q_scale"]), I.mul(I.to_i64(row), 4)),
                                 I.select(valid, 4 * p.heads, 0))

    def _widened_query(self, q_rsrc, j, valid):
        """fp4 on the plain fp8 MFMA: per 16-head tile ``m``, the A operands of k-steps 0..3 (k-step
        ``ks`` = MXFP4 group ``ks``: lane quarter ``g`` feeds codes ``8g..8g+7`` of it, widened
        to fp8 by :meth:`_widen_e2m1`), and the exponent words of the heads whose results the
        lane holds (``16m + 4g + i``, i < 4)."""
        I = self.ops
        p, a = self.p, self.a
        scale_rsrc = self._query_scale_resource(j, valid)
        operands, words = [], []
        for m in range(p.m_tiles):
            head = I.mul(I.add(self.c, 16 * m), a["stride_q_h"])
            operands.append([self._widen_e2m1(I.buffer_load_i32(q_rsrc, I.add(head, I.add(I.mul(self.g, 4), 16 * ks))))
                             for ks in range(p.k_steps)])
            words.append([I.buffer_load_i32(scale_rsrc, I.mul(I.add(I.mul(self.g, 4), 16 * m + i), 4))
                          for i in range(4)])
        return operands, words

    def _widen_e2m1(self, packed):
        """Eight e2m1 codes (four packed bytes) as eight fp8 bytes of the chip's flavour, exactly:
        the even codes (low nibbles) in the low word, the odd ones in the high word (A and B are
        widened alike, so the order of a k-step's elements does not matter). A byte table
        (``v_perm_b32``) maps the magnitudes; the sign goes to bit 7 where the magnitude is not
        0 (e2m1's -0 must not become e4m3fnuz's NaN byte 0x80)."""
        I = self.ops
        table_hi, table_lo = (_signed32(w) for w in E2M1_AS_FP8[self.p.arch])
        halves = []
        for nibbles in (I.bit_and(packed, 0x0F0F0F0F), I.bit_and(I.shr(packed, 4), 0x0F0F0F0F)):
            magnitude = I.bit_and(nibbles, 0x07070707)
            fp8 = I.byte_permute(table_hi, table_lo, magnitude)
            nonzero = I.bit_and(I.add(magnitude, 0x7F7F7F7F), _signed32(0x80808080))  # bit 7: magnitude >= 1
            sign = I.bit_and(I.mul(nibbles, 16), nonzero)  # bit 3 of each code -> bit 7 of its byte
            halves.append(I.add(fp8, sign))  # disjoint bits: the table's bytes are below 0x80
        return I.i64_from_halves(halves[0], halves[1])

    def _exponent(self, word, group):
        """ue8m0 byte ``group`` of an exponent word."""
        I = self.ops
        return I.bit_and(I.shr(word, 8 * group) if group else word, 0xFF) if group < 3 else I.shr(word, 24)

    def _query_exponents(self, j, valid):
        """fp4: per 16-head tile ``m``, the ue8m0 exponent of this lane's query group: byte ``g``
        of ``q_scale[b, j, 16m + c]`` (in the low byte, where the scaled MFMA reads it)."""
        I = self.ops
        p = self.p
        rsrc = self._query_scale_resource(j, valid)
        shift = I.mul(self.g, 8)
        return [I.shr(I.buffer_load_i32(rsrc, I.mul(I.add(self.c, 16 * m), 4)), shift) for m in range(p.m_tiles)]

    # ------------------------------------------------------------------ a stage's pages
    def stage_pages(self, chunk, live):
        """Cache blocks of stage ``chunk``: ``(base address, in range)`` per page. Pages at or past
        ``end`` and stages not ``live`` get an empty descriptor, so their keys are never read;
        they read table entry 0 instead of theirs (the select is on the offset, not the result,
        so this costs nothing over masking the block id): every table load stays inside the row
        the table's width admits, and entry 0 names a real block (a segment exists only for a
        sequence with visible tokens), whose scales the prefetch may read harmlessly."""
        I = self.ops
        p, a = self.p, self.a
        first_token = I.mul(chunk, p.chunk_k)
        pages = []
        for k in range(p.pages_per_stage):
            start = I.add(first_token, k * p.kv_block_size) if p.kv_block_size < p.chunk_k else first_token
            page = I.shr(start, _log2(p.kv_block_size))
            ok = I.both(live, I.lt(start, self.end))
            block = I.scalar_load(self.table_rsrc, I.select(ok, I.mul(page, 4), 0))
            pages.append((I.add(self.kv_base, I.mul(I.to_i64(block), I.to_i64(a["stride_block"]))), ok))
        return pages

    def page_of_tile(self, tile):
        """Stage-local page index of stage tile ``tile`` (an i32 value)."""
        I = self.ops
        if self.p.pages_per_stage == 1:
            return I.const32(0)
        return I.shr(tile, _log2(self.p.kv_block_size // TILE))

    def tile_in_page(self, chunk, tile):
        """Index of stage tile ``tile`` among the 16-token tiles of its cache block."""
        I = self.ops
        p = self.p
        token = I.add(I.mul(chunk, p.chunk_k), I.mul(tile, TILE))
        return I.shr(I.bit_and(token, p.kv_block_size - 1), 4)

    def issue_stage(self, chunk, pages, parity):
        """Start the asynchronous copy of stage ``chunk`` into LDS buffer ``parity``. Wave w copies
        the stage's tiles ``[w * n, (w + 1) * n)``, n = tiles_per_stage / 4."""
        I = self.ops
        p = self.p
        dma = p.dma_bytes
        per_instr = WAVE_SIZE * dma
        key_bytes = p.kv_block_size * (p.key_row_bytes + 4)  # keys + scale words: the block's packed extent
        stage_base = I.add(self.lds, I.mul(parity, p.stage_bytes))
        for u in range(p.dma_tiles_per_wave):
            tile = I.add(I.mul(self.wave, p.dma_tiles_per_wave), u)
            page = self.page_of_tile(tile)
            base = _pick(I, [pb for pb, _ in pages], page)
            ok = _pick(I, [ok for _, ok in pages], page)
            rsrc = I.buffer_resource(base, I.select(ok, key_bytes, 0))
            page_offset = I.uniform(I.mul(self.tile_in_page(chunk, tile), p.tile_bytes))
            lds_tile = I.add(stage_base, I.mul(tile, p.tile_bytes))
            for k in range(p.dma_per_tile):
                in_tile = k * per_instr  # bytes of the LDS tile this instruction fills
                source = I.uniform(I.add(page_offset, self._dma_source_offset(in_tile)))
                I.lds_dma(rsrc, I.uniform(I.add(lds_tile, in_tile)), self.dma_lane_offset, source, dma)

    def _dma_lane_part(self):
        """Per-lane part of the source offset of a DMA instruction (the same for all of them):
        lane ``l`` deposits its bytes at LDS ``M0 + l * dma_bytes``; this is where they come from,
        relative to the first byte of the instruction's source (``_dma_source_offset``)."""
        I = self.ops
        p, lane = self.p, self.lane
        if p.preshuffle:
            return I.mul(lane, p.dma_bytes)
        if p.dma_bytes == 4:  # 256 B = one (tile, 16-byte) slab: lane -> token l/4, bytes 4*(l%4)..
            return I.add(I.mul(I.shr(lane, 2), p.key_row_bytes), I.mul(I.bit_and(lane, 3), 4))
        # 1 KiB = four 16-byte slabs: lane -> token l%16, bytes 16*(l/16)..
        return I.add(I.mul(I.bit_and(lane, 15), p.key_row_bytes), I.mul(I.shr(lane, 4), 16))

    def _dma_source_offset(self, in_tile: int) -> int:
        """Source offset (inside the cache tile) of the instruction filling LDS tile bytes from
        ``in_tile``: the same bytes for Preshuffle; the ``in_tile // 256``-th 16-dim slab of token
        row 0 for the plain layout (the lane part adds the token rows)."""
        return in_tile if self.p.preshuffle else 16 * (in_tile // 256)

    # ------------------------------------------------------------------ scales
    def final_tile(self, group):
        """Stage tile whose token ``c`` this lane holds after reducing tile group ``group``."""
        I = self.ops
        p = self.p
        first = I.add(I.mul(self.tg, p.tiles_per_wave), group * p.reduce_group)
        sub = {4: self.g, 2: I.shr(self.g, 1), 1: I.const32(0)}[p.reduce_group]
        return I.add(first, sub)

    def prefetch_scales(self, chunk, pages):
        """The per-token words after a block's keys, loaded a stage ahead. fp8: per lane and tile
        group, the fp32 scale of the token this lane will store. fp4: per tile of the wave, the
        exponent word of token ``c`` (the lane quarter picks its group's byte at the MFMA)."""
        I = self.ops
        p = self.p
        if p.kv_format == "fp4":
            first = I.mul(self.tg, p.tiles_per_wave)
            return [I.global_load_i32(self._scale_word(chunk, pages, I.add(first, k))) for k in range(p.tiles_per_wave)]
        return [I.global_load_f32(self._scale_word(chunk, pages, self.final_tile(group)))
                for group in range(p.reduce_groups)]

    def _scale_word(self, chunk, pages, tile):
        """Address of the word after the keys of token ``c`` of stage tile ``tile``."""
        I = self.ops
        p = self.p
        base = _pick(I, [pb for pb, _ in pages], self.page_of_tile(tile))
        token = I.add(I.mul(chunk, p.chunk_k), I.add(I.mul(tile, TILE), self.c))
        in_page = I.bit_and(token, p.kv_block_size - 1)
        offset = I.add(I.mul(in_page, 4), p.kv_block_size * p.key_row_bytes)
        return I.add(base, I.to_i64(offset))

    # ------------------------------------------------------------------ compute
    def compute_stage(self, chunk, parity, scales, rows):
        """Score the wave's tiles of the stage in LDS buffer ``parity`` for ``rows``; a padding last
        slot (``last_slot_real`` false) branches around its MFMAs and its reduction and store.

        Tile by tile with a scheduling fence after each: the next tile's keys are read from LDS
        while the current tile's MFMAs run, and only one tile's accumulators (rows x heads / 16
        independent MFMA chains) are live, which keeps the VGPR count within the occupancy
        target."""
        I = self.ops
        p = self.p
        stage_base = I.add(self.lds, I.mul(parity, p.stage_bytes))
        lane_part = I.add(I.mul(self.g, 256), I.mul(self.c, 16))
        if p.kv_format == "fp4" and p.mfma == "fp8":  # widened fp4: token c, codes 8g..8g+7 of a group
            word_part = I.add(I.mul(self.c, 16), I.mul(self.g, 4))
        first_tile = I.mul(self.tg, p.tiles_per_wave)

        def read_keys(k):  # B operands of the wave's k-th tile: k-steps 0..3 (fp4: group g's 32 codes)
            addr = I.add(I.add(stage_base, I.mul(I.add(first_tile, k), p.tile_bytes)), lane_part)
            if p.kv_format == "fp4" and p.mfma == "fp8":  # k-step ks: 4 bytes of group ks's 16-byte slab
                words = I.add(I.add(stage_base, I.mul(I.add(first_tile, k), p.tile_bytes)), word_part)
                return dict(codes=[self._widen_e2m1(I.lds_read_i32(I.add(words, 256 * ks))) for ks in range(p.k_steps)],
                            exponents=[I.sub(self._exponent(scales[k], ks), EXPONENT_BIAS_2) for ks in range(p.k_steps)])
            if p.kv_format == "fp4":
                return dict(codes=I.lds_read_pair(addr), exponents=I.shr(scales[k], I.mul(self.g, 8)))
            return I.lds_read_pair(addr) + I.lds_read_pair(I.add(addr, 1024))

        def only_if_real(slot, work, otherwise=None):
            """``work()`` for a real row; in the last slot of a wave where it is padding, skipped
            (a wave-uniform branch) and ``otherwise()`` instead."""
            if slot < len(rows) - 1 or self.last_slot_real is None:
                return work()
            if otherwise is None:
                return I.if_then(self.last_slot_real, work)
            return I.if_value(self.last_slot_real, work, otherwise)

        keys = read_keys(0)
        partials = [[] for _ in rows]
        for k in range(p.tiles_per_wave):
            upcoming = read_keys(k + 1) if k + 1 < p.tiles_per_wave else None
            for slot, (row, row_partials) in enumerate(zip(rows, partials)):
                row_partials.append(only_if_real(slot, lambda: self._head_sum(row, keys), I.zero_f32))
            if (k + 1) % p.reduce_group == 0:  # a tile group is complete: reduce and store it
                group = k // p.reduce_group
                offset = self._group_offset(chunk, group)
                scale = scales[group] if p.kv_format == "fp8" else None
                for slot, (row, row_partials) in enumerate(zip(rows, partials)):
                    only_if_real(slot, lambda: self._store_row(row, row_partials, offset, scale))
                partials = [[] for _ in rows]
            I.sched_fence()
            keys = upcoming

    def _group_offset(self, chunk, group):
        """Output byte offset of this lane's token after reducing tile group ``group`` (out of
        range for the lanes holding duplicates)."""
        I = self.ops
        p = self.p
        token = I.add(I.mul(chunk, p.chunk_k), I.add(I.mul(self.final_tile(group), TILE), self.c))
        writer = {4: I.true(), 2: I.eq(I.bit_and(self.g, 1), 0), 1: I.eq(self.g, 0)}[p.reduce_group]
        return I.select(writer, I.mul(token, p.logits_bytes), I.OUT_OF_RANGE)

    def _store_row(self, row, row_partials, offset, scale):
        # ReLU is positively homogeneous and scales are >= 0: scale after the head sum (fp4 keys
        # have no per-token scale: ``None``)
        I = self.ops
        logits = self._reduce_tiles(row_partials)
        logits = logits if scale is None else I.fmul(logits, scale)
        if self.p.logits_dtype == "bf16":  # the fp32 result, rounded once (to nearest even)
            I.buffer_store_bf16(logits, row["out"], offset)
        else:
            I.buffer_store_f32(logits, row["out"], offset)

    def _head_sum(self, row, tile_keys):
        """``sum_h w[h] * relu(S[h, token])`` over this lane's heads, for one row and one tile."""
        I = self.ops
        total = I.zero_f32()
        for m in range(self.p.m_tiles):
            if self.p.kv_format == "fp4" and self.p.mfma == "fp8":
                total = self._widened_head_sum(row, tile_keys, m, total)
                continue
            if self.p.kv_format == "fp4":  # e2m1 operands, each lane's 32 codes scaled by its group's exponent
                acc = I.mfma_scaled(row["q"][m], tile_keys["codes"], I.zero_acc(), row["q_exponents"][m],
                                    tile_keys["exponents"], operand_format="fp4")
            elif self.p.mfma == "f8f6f4":  # all four k-steps' operands in one 128-deep instruction
                acc = I.mfma_scaled(row["q"][m], tile_keys, I.zero_acc(), NEUTRAL_SCALE, NEUTRAL_SCALE)
            else:
                acc = I.zero_acc()
                for ks in range(self.p.k_steps):
                    acc = I.mfma(row["q"][m][ks], tile_keys[ks], acc)
            for i in range(4):
                total = I.fma(row["w"][m][i], I.relu(I.acc_element(acc, i)), total)
        return total

    def _widened_head_sum(self, row, tile_keys, m, total):
        """fp4 widened to fp8, heads ``16m..16m+15``: one MFMA per group (its own accumulator: the
        products of e2m1 values and their sums over 32 elements are exact in fp32), then each
        group's sum times ``2^(eq + ek - 254)`` (``v_ldexp_f32``: exact up to fp32's range) and
        the four added, as the reference's ``sum_g 2^(eq_g + ek_g - 254) * dot_g``."""
        I = self.ops
        accs = [I.mfma(row["q"][m][ks], tile_keys["codes"][ks], I.zero_acc()) for ks in range(self.p.k_steps)]
        for i in range(4):
            word = row["q_words"][m][i]
            score = None
            for ks, acc in enumerate(accs):
                term = I.ldexp(I.acc_element(acc, i), I.add(self._exponent(word, ks), tile_keys["exponents"][ks]))
                score = term if score is None else I.fadd(score, term)
            total = I.fma(row["w"][m][i], I.relu(score), total)
        return total

    def _reduce_tiles(self, partials):
        """Sum over the 4 lane quarters, scattering tiles: with n tiles in, lane quarter g ends with
        tile ``g * n // 4`` (n = 4: each quarter its own tile; n < 4: duplicates)."""
        I = self.ops
        upper = I.eq(I.bit_and(self.g, 2), 2)  # exchange with quarter g ^ 2
        odd = I.eq(I.bit_and(self.g, 1), 1)  # exchange with quarter g ^ 1
        if len(partials) == 1:
            x = I.fadd(partials[0], I.shuffle_xor(partials[0], 32))
            return I.fadd(x, I.shuffle_xor(x, 16))
        half = len(partials) // 2
        kept = []
        for k in range(half):  # keep tiles [0, half) in the lower quarters, [half, n) in the upper
            lo, hi = partials[k], partials[half + k]
            keep, send = I.select(upper, hi, lo), I.select(upper, lo, hi)
            kept.append(I.fadd(keep, I.shuffle_xor(send, 32)))
        if half == 1:
            return I.fadd(kept[0], I.shuffle_xor(kept[0], 16))
        keep, send = I.select(odd, kept[1], kept[0]), I.select(odd, kept[0], kept[1])
        return I.fadd(keep, I.shuffle_xor(send, 16))

    # ------------------------------------------------------------------ one segment
    def segment(self, b, seq_len, end, c0, c1):
        """Stages ``[c0, c1)`` of sequence ``b`` (uniform; ``c0 < c1`` or an empty loop): its
        rows into registers, then the double-buffered stage loop."""
        I = self.ops
        p, a = self.p, self.a
        self.b, self.seq_len, self.end, self.c0, self.c1 = b, seq_len, end, c0, c1
        if p.schedule == BALANCED:
            self._thread_values(I.smin(I.add(b, p.threads - 1), p.threads - 1))
        table_row = I.add(I.base_address(a["table"]), I.mul(I.mul(I.to_i64(b), I.to_i64(a["stride_table"])), 4))
        self.table_rsrc = I.buffer_resource(table_row, I.mul(a["max_blocks"], 4))
        self.load_rows()

        pages = self.stage_pages(c0, I.lt(c0, c1))
        self._role(self.producer, lambda: self.issue_stage(c0, pages, I.const32(0)))
        scales = self.prefetch_scales(c0, pages)

        def stage(chunk, carried):
            nxt = I.add(chunk, 1)
            pages = self.stage_pages(nxt, I.lt(nxt, c1))  # scalar loads overlap the wait
            parity = I.bit_and(I.sub(chunk, c0), 1)
            I.wait_vm_and_barrier()  # stage `chunk` landed (every wave's part); its other buffer is free
            self._role(self.producer, lambda: self.issue_stage(nxt, pages, I.sub(1, parity)))
            upcoming = self.prefetch_scales(nxt, pages)
            self._role(self.consumer, lambda: self.compute_stage(chunk, parity, carried, self.rows))
            return upcoming

        I.for_range(c0, c1, scales, stage)
        if p.schedule == BALANCED:
            # the next segment's first copy goes to buffer 0, which slower waves may still read
            I.wait_vm_and_barrier()
        else:
            I.wait_vm()  # no copy may land in LDS after the workgroup ends

    def _role(self, mine, work):
        """``work()`` on the waves of one role (``mine``: wave-uniform; ``None``: every wave).
        The copies and the scoring are the role-specific work; the rest (the schedule, the
        page walk, the rows' registers, the scale prefetch, the barriers) every wave runs, so
        the barriers stay outside any branch and the loop-carried scales need no branch
        results (a producer's own scales and Q loads go unused)."""
        if mine is None:
            work()
        else:
            self.ops.if_then(mine, work)

    # ------------------------------------------------------------------ the whole kernel
    def run(self):
        I = self.ops
        self.lens_resource()
        self.kv_base = I.base_address(self.a["kv"])
        self.lds = I.lds_allocate(self.p.lds_bytes)
        if self.p.schedule == BALANCED:
            self.balanced_schedule()
        else:
            self.split_schedule()


ARG_NAMES = ("q", "kv", "weights", "out", "lens", "table", "q_scale", "stride_q_b", "stride_q_j", "stride_q_h", "stride_block",
             "stride_w", "stride_out", "stride_lens_b", "stride_lens_j", "stride_table", "max_model_len",
             "max_blocks", "grid_x", "batch", "stride_qs_b", "stride_qs_j")


def grid(plan: KernelPlan, grid_x: int, batch: int) -> tuple[int, int]:
    """Workgroups ``(x, y)``: ``grid_x`` persistent programs (balanced), or ``grid_x`` splits per
    sequence (split)."""
    return (grid_x, 1) if plan.schedule == BALANCED else (grid_x, batch)


def launch_arguments(args, grid_x: int) -> tuple:
    """The launcher's positional arguments for one call (no stream); ``grid_x`` is the number of
    persistent programs (balanced) or of splits per sequence (split). Tensors are passed as views
    of the caller's storage (no copies): fp8 as uint8, 1-D lengths as a ``[B, 1]`` view so the
    kernel sees one tensor rank (and one compiled specialisation) for both length layouts."""
    lens = args.context_lens
    if lens.dim() == 1:
        lens_2d_view = lens.as_strided((lens.shape[0], 1), (lens.stride(0), 1))
        stride_lens_b, stride_lens_j = lens.stride(0), 0
    else:
        lens_2d_view, (stride_lens_b, stride_lens_j) = lens, lens.stride()
    q = args.q.view(torch.uint8)
    # fp8 calls have no query exponents: the lengths stand in for the tensor argument, never read
    q_scale, (stride_qs_b, stride_qs_j) = ((args.q_scale, args.q_scale.stride()[:2]) if args.q_scale is not None
                                           else (lens_2d_view, (0, 0)))
    return (
        q, args.kv_cache, args.weights, args.out, lens_2d_view, args.block_table, q_scale,
        q.stride(0), q.stride(1), q.stride(2), args.kv_cache.stride(0), args.weights.stride(0), args.out.stride(0),
        stride_lens_b, stride_lens_j, args.block_table.stride(0), args.max_model_len, args.max_blocks, grid_x,
        args.problem.shape_key.batch, stride_qs_b, stride_qs_j,
    )
