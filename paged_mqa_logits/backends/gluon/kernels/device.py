"""Device helpers every ``gluon`` kernel shares (``@gluon.jit``; no host code).

* row lengths: the tokens that size a sequence's work, a query row's visible length, the
  first position no row sees, a KV split's tile range (``problem.py`` row semantics);
* the balanced schedule: a program's equal share of the batch's tiles found by an in-kernel
  prefix sum over the lengths (``schedule.share`` / ``schedule.locate``);
* paged addressing: a token's cache block (clamped into the cache), the byte offsets of its
  key bytes (plain and Preshuffle) and of its scale.

The register-MMA kernel (``register_mma.py``) and the wgmma kernels (``wgmma.py``,
``wgmma_ws.py``, ``wgmma_pipes.py``) of this directory are built from these.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

#: kernel parameters that change from call to call without changing the code: never
#: specialised, so a warm-up compile serves every later call (and CI compiles what runs)
DYNAMIC_PARAMS = ("max_model_len", "max_blocks", "num_splits", "batch", "num_blocks")


# ----------------------------------------------------------------------------- row lengths
@gluon.jit
def sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N: gl.constexpr, LENS_2D: gl.constexpr):
    """Tokens that size sequence ``b``'s work: ``L_b`` (1-D) or ``max_j lens[b, j]`` (2-D), >= 0.

    Scalar loads: a handful of uniform reads, no layout needed."""
    row = lens_ptr + b.to(gl.int64) * stride_lens_b
    seq_len = gl.load(row)
    if LENS_2D:
        for j in gl.static_range(1, NEXT_N):
            seq_len = gl.maximum(seq_len, gl.load(row + j * stride_lens_j))
    return gl.maximum(seq_len, 0)


@gluon.jit
def row_length(lens_ptr, b, j, seq_len, stride_lens_b, stride_lens_j, NEXT_N: gl.constexpr, LENS_2D: gl.constexpr):
    """Visible length of query row ``(b, j)`` (scalar ``j``, static or dynamic), >= 0."""
    if LENS_2D:
        row_len = gl.load(lens_ptr + b.to(gl.int64) * stride_lens_b + j * stride_lens_j)
    else:
        row_len = seq_len - (NEXT_N - 1) + j
    return gl.maximum(row_len, 0)


@gluon.jit
def visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK_SIZE: gl.constexpr):
    """First position no row of the sequence may see: ``min(seq_len, max_model_len, table width)``."""
    return gl.minimum(gl.minimum(seq_len, max_model_len), max_blocks * KV_BLOCK_SIZE)


@gluon.jit
def share_run(lens_ptr, b, tile, item, stop, stride_lens_b, stride_lens_j, max_model_len, max_blocks,
              NEXT_N: gl.constexpr, LENS_2D: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr, CHUNK: gl.constexpr):
    """Tiles of ``CHUNK`` tokens a balanced share walks in sequence ``b`` from its tile ``tile``
    (item ``item`` of the share, which stops at ``stop``): the sequence's remaining tiles, or
    what is left of the share. <= 0 for a sequence with nothing left to walk."""
    seq_len = sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
    tiles = gl.cdiv(visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK_SIZE), CHUNK)
    return gl.minimum(tiles - tile, stop - item)


@gluon.jit
def split_tile_range(end, split, num_splits, CHUNK: gl.constexpr):
    """``[first, stop)`` tiles of ``CHUNK`` tokens owned by KV split ``split``: an even share of
    the tiles the sequence actually has (so the host's split count only needs to be an upper
    bound; programs with an empty range do nothing)."""
    num_tiles = gl.cdiv(end, CHUNK)
    first = num_tiles * split // num_splits
    stop = num_tiles * (split + 1) // num_splits
    return first, stop


# ----------------------------------------------------------------------------- balanced schedule
#: sequences whose lengths one scan step reads (a multiple of every kernel's thread count)
SCAN_BLOCK = gl.constexpr(512)


@gluon.constexpr_function
def scan_layout(threads_per_warp, num_warps):
    """1-D layout of one scan step: ``SCAN_BLOCK`` lengths spread over the whole program."""
    return gl.BlockedLayout([SCAN_BLOCK // (threads_per_warp * num_warps)], [threads_per_warp], [num_warps], [0])


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _block_tiles(lens_ptr, first_seq, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks,
                 NEXT_N: gl.constexpr, LENS_2D: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr, CHUNK: gl.constexpr,
                 LAYOUT: gl.constexpr, TAIL_UNIT: gl.constexpr = 0):
    """Tiles of sequences ``first_seq .. first_seq + SCAN_BLOCK`` (0 past the batch): vector
    form of ``sequence_length`` / ``visible_end``. With ``TAIL_UNIT > 0``, instead the
    ``TAIL_UNIT``-position units of each sequence's tail: the columns ``[tiles * CHUNK,
    max_model_len)`` past its last tile, which ``clean_logits`` sets to ``-inf``."""
    seq = first_seq + gl.arange(0, SCAN_BLOCK, LAYOUT)
    valid = seq < batch
    row = lens_ptr + seq.to(gl.int64) * stride_lens_b
    seq_len = gl.load(row, mask=valid, other=0)
    if LENS_2D:
        for j in gl.static_range(1, NEXT_N):
            seq_len = gl.maximum(seq_len, gl.load(row + j * stride_lens_j, mask=valid, other=0))
    end = gl.minimum(gl.minimum(gl.maximum(seq_len, 0), max_model_len), max_blocks * KV_BLOCK_SIZE)
    tiles = gl.cdiv(end, CHUNK)
    if TAIL_UNIT > 0:
        tiles = gl.where(valid, gl.cdiv(gl.maximum(max_model_len - tiles * CHUNK, 0), TAIL_UNIT), 0)
    return seq, tiles


@gluon.jit
def balanced_share(lens_ptr, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks, program, num_programs,
                   NEXT_N: gl.constexpr, LENS_2D: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr, CHUNK: gl.constexpr,
                   LAYOUT: gl.constexpr, TAIL_UNIT: gl.constexpr = 0):
    """``(start, stop, seq, tile)``: program ``program``'s items ``[start, stop)`` of the batch's
    tiles and the (sequence, tile) of ``start`` (``schedule.share`` / ``schedule.locate``); with
    ``TAIL_UNIT > 0`` the same for the units of the sequences' tails (see :func:`_block_tiles`).

    Two passes over the lengths (the second from L1): the total, then the prefix sum locating
    ``start``: ``seq = #{b : cum(b) <= start}`` and ``tile = start - max{cum(b) <= start}``
    with ``cum`` the inclusive prefix sum of the tile counts."""
    total = gl.to_tensor(0)
    for first_seq in range(0, batch, SCAN_BLOCK):
        _, tiles = _block_tiles(lens_ptr, first_seq, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks,
                                NEXT_N, LENS_2D, KV_BLOCK_SIZE, CHUNK, LAYOUT, TAIL_UNIT)
        total += gl.sum(tiles, axis=0)
    start = (total.to(gl.int64) * program // num_programs).to(gl.int32)
    stop = (total.to(gl.int64) * (program + 1) // num_programs).to(gl.int32)
    seq = gl.to_tensor(0)
    before = gl.to_tensor(0)
    carried = gl.to_tensor(0)
    for first_seq in range(0, batch, SCAN_BLOCK):
        _, tiles = _block_tiles(lens_ptr, first_seq, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks,
                                NEXT_N, LENS_2D, KV_BLOCK_SIZE, CHUNK, LAYOUT, TAIL_UNIT)
        cum = gl.associative_scan(tiles, 0, _add) + carried
        done = cum <= start
        seq += gl.sum(done.to(gl.int32), axis=0)
        before = gl.maximum(before, gl.max(gl.where(done, cum, 0), axis=0))
        carried += gl.sum(tiles, axis=0)
    return start, stop, seq, start - before


# ----------------------------------------------------------------------------- paged addressing
@gluon.jit
def tile_pages(table_row, tokens, end, num_blocks, KV_BLOCK_SIZE: gl.constexpr, LOAD: gl.constexpr):
    """int64 cache block of each token (tokens at or past ``end`` get block 0 and their table
    entries are never read: they may be garbage or past the table's width).

    Block ids are clamped into ``[0, num_blocks)``: whatever the table holds, no gather leaves
    the cache (an invalid id yields the logits of a real block, the documented rule; two
    integer ops per token, off the memory path)."""
    pages = LOAD(table_row, tokens // KV_BLOCK_SIZE, tokens < end, 0)
    return gl.maximum(gl.minimum(pages, num_blocks - 1), 0).to(gl.int64)


@gluon.jit
def key_offset_parts(pages, tokens, d, stride_block, KV_BLOCK_SIZE: gl.constexpr, HEAD_DIM: gl.constexpr,
                     PRESHUFFLE: gl.constexpr):
    """The byte offset of key (token, dim) split into a per-token part (int64, the page base
    included) and a per-dim part, so kernels can lay the ``[T, D]`` or ``[D, T]`` sum out as
    their MMA operand needs: plain ``page*stride + slot*D | d``; Preshuffle
    ``page*stride + (slot//16)*16*D + (slot%16)*16 | (d//16)*256 + d%16``."""
    slot = tokens % KV_BLOCK_SIZE
    if PRESHUFFLE:
        token_part = (slot // 16) * (16 * HEAD_DIM) + (slot % 16) * 16
        dim_part = (d // 16) * 256 + d % 16
    else:
        token_part = slot * HEAD_DIM
        dim_part = d
    return pages * stride_block + token_part, dim_part


@gluon.jit
def scale_offsets(pages, tokens, stride_block, KV_BLOCK_SIZE: gl.constexpr, HEAD_DIM: gl.constexpr):
    """int64 offsets, in fp32 elements, of the scales of ``tokens``: byte
    ``block*stride0 + KV_BLOCK_SIZE*D + 4*slot`` (``stride0`` is a multiple of 4, checked on the host)."""
    return pages * (stride_block // 4) + (KV_BLOCK_SIZE * HEAD_DIM // 4) + tokens % KV_BLOCK_SIZE
