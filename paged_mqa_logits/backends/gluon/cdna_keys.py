"""How the CDNA ``mfma`` kernel brings key tiles of a plain (non-preshuffled) cache into its MFMA
operand: the ``KeyLoad`` knob (``mfma.MfmaVariant`` resolves it; ``lds`` configs run
``kernels.register_mma.register_mma_logits_kernel_key_layout`` with the layouts and conversions of
``kernels/mfma.py``; this module holds the knob and its costs).

A plain cache stores each token's 128 key bytes as one contiguous row (the layout vLLM's writer
produces). The MFMA B operand (``DotOperandLayout(1, acc, k_width=16)``) gives a lane 16
contiguous bytes of one token per register group, with the lanes of one group spread over 32
tokens (32x32 MFMA) or 16 (16x16). So:

* ``direct`` (default): keys are gathered straight into the operand layout. Each 16-byte load
  instruction of a wave touches 32 token rows x 32 bytes (16 rows x 64 bytes for 16x16 tiles):
  32 (16) distinct cache lines, each only partly used by that instruction; the wave's other
  loads of the tile use the rest of those lines.
* ``lds``: keys are gathered in :func:`gather_layout`, where 8 lanes read one whole 128-byte
  row and a wave instruction covers 8 complete rows (8 lines of 128 B, 16 of 64 B), then moved
  into the operand layout through LDS (``ds_write_b128``, ``ds_read_b128``). Each wave gathers
  exactly the tokens its MFMAs read (the accumulator's 32- or 16-token groups per wave), so
  no wave reads another's bytes.

  The shared-memory layout, decided here once: with 32x32 tiles (ChunkK >= 128)
  ``gl.convert_layout`` does the round trip, in the swizzled layout Triton's conversion picks
  for this pair of layouts (16-byte vectors on both sides, the fewest bank conflicts it can
  find) and with one ``s_barrier`` per tile; an explicit ``allocate_shared_memory`` + ``load``
  compiled to the same LDS instructions but two barriers (the compiler cannot tell that the
  exchange is wave-local). With 16x16 tiles (ChunkK 64) the conversion is lowered as a lane
  shuffle instead (``ds_bpermute`` and byte permutes: 224 instead of 99 instructions in the tile
  loop, 92 instead of 64 VGPRs, gfx942 H 32), so there the tile goes through
  :func:`kernels.mfma.staging_layout` explicitly (147 instructions, 66 VGPRs, two barriers). That layout
  is XOR-swizzled rather than padded: the same conflict-free banks without 1/8 more LDS.

Costs of ``lds`` on top of ``direct`` per tile and wave (``T = ChunkK / 4`` tokens): ``T/8``
block-table loads instead of ``T/32`` (a lane now holds ``T/8`` tokens; they hit the same table
line), ``T/8`` ``ds_write_b128`` and as many ``ds_read_b128``, one or two ``s_barrier``,
8 or 16 KiB of LDS (:func:`lds_bytes`), and VGPRs (:func:`vgprs`). ``python
tools/cdna_key_loads.py`` prints the measured table; docs/VERIFICATION.md records it and why
``direct`` stays the default.

The preshuffled layout is already stored in the operand's 16-token x 16-byte order, so
``lds`` is offered for plain caches only.
"""

from __future__ import annotations

from ...triton_internals.layouts import linear_bases
from .kernels.mfma import VECTOR_BYTES, gather_layout

KNOB = "KeyLoad"
DIRECT = "direct"
LDS = "lds"
#: values of the knob, the default first
KEY_LOADS = (DIRECT, LDS)


def key_loads(preshuffle: bool) -> tuple[str, ...]:
    """The ``KeyLoad`` values a problem's candidates take."""
    return (DIRECT,) if preshuffle else KEY_LOADS


#: most key bytes one conversion round moves through LDS: Triton converts a larger tile in
#: several rounds through the same scratch (measured: ChunkK 256 uses 16 KiB, as 128 does)
LDS_ROUND_BYTES = 16 * 1024


def lds_bytes(chunk: int, key_load: str, head_dim: int = 128) -> int:
    """LDS of the key conversion per program: one ``[D, ChunkK]`` fp8 tile, at most one round."""
    return min(chunk * head_dim, LDS_ROUND_BYTES) if key_load == LDS else 0


def vgprs(chunk: int, key_load: str, prefetch: int, num_warps: int = 4) -> int:
    """VGPRs per lane the ``lds`` path needs beyond ``direct`` (``T = ChunkK / 4``): with
    ``Prefetch`` the next tile in flight, the gathered tile being converted and the operand
    overlap, ``T/2`` more; without, the gathered tile and the operand overlap briefly, ``T/8``.
    Calibrated on 116 (gfx942) and 306 (gfx950) compiled ``lds`` candidates of four plain-cache
    shapes with the direct estimate: it admits none that spilled and rejects one that fit."""
    if key_load != LDS:
        return 0
    tokens = chunk // num_warps
    return tokens // 2 if prefetch else tokens // 8


def cache_lines_per_load(operand_layout, key_load: str, chunk: int, line_bytes: int, num_warps: int = 4,
                         threads_per_warp: int = 64, head_dim: int = 128) -> int:
    """Distinct ``line_bytes`` cache lines one 16-byte key load instruction of a wave touches
    (the most over the wave's loads of a tile), from the layout the keys are gathered in
    (``operand_layout``, the MFMA B operand, for ``direct``): lane ``l``'s register group ``i``
    holds 16 bytes at ``(dim, token)``; a plain cache row is ``head_dim`` contiguous bytes and
    the tokens of a tile are consecutive rows of a block (``kv_block_size >= 32``)."""
    if key_load == DIRECT:
        layout = operand_layout
    else:
        layout = gather_layout(operand_layout.parent.instr_shape[1], num_warps, threads_per_warp)
    linear = linear_bases(layout, [head_dim, chunk])
    vector = [[1, 0], [2, 0], [4, 0], [8, 0]]  # 16 consecutive dims (bytes) per register group
    if linear.reg_bases[:4] != vector:
        raise ValueError(f"{layout} does not give a lane 16 contiguous key bytes per register group")

    def coordinate(bases, index):
        dim = token = 0
        for bit, (d, t) in enumerate(bases):
            if index >> bit & 1:
                dim, token = dim ^ d, token ^ t
        return dim, token

    groups = 1 << (len(linear.reg_bases) - 4)
    most = 0
    for group in range(groups):  # one load instruction per register group (warp 0)
        lines = set()
        for lane in range(threads_per_warp):
            ld, lt = coordinate(linear.lane_bases, lane)
            gd, gt = coordinate(linear.reg_bases[4:], group)
            for byte in (0, VECTOR_BYTES - 1):
                lines.add(((lt ^ gt) * head_dim + (ld ^ gd) + byte) // line_bytes)
        most = max(most, len(lines))
    return most
