"""The one reference implementation, and the helpers that build inputs in the cache layout.

Everything that checks numbers (tests, the demo, the bench, the tuner) compares against
:func:`reference_logits`. It is plain torch, accumulates in float32 on the dequantised inputs
(fp8, or MXFP4 through :mod:`paged_mqa_logits.fp4`, whose helpers it re-exports; both
dequantise exactly) and is written for clarity over speed; :func:`logits_into` is the same
computation in column chunks, which the ``torch`` backend uses to serve calls (no host-device
synchronisation). bf16 logits are the fp32 logits rounded once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .fp4 import (E2M1_MAX, E2M1_VALUES, dequantize_fp4, e2m1_values, pack_e2m1,  # noqa: F401 (re-exported)
                  quantize_e2m1, quantize_fp4, ue8m0_bytes, ue8m0_values, ue8m0_words, unpack_e2m1)
from .problem import HEAD_DIM, KV_FORMATS, SCALE_BYTES, fp8_flavour, key_bytes, row_lengths

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 240.0}
SHUFFLE_TILE = 16  # Preshuffle: 16 tokens x 16 bytes tiles
#: key elements :func:`make_inputs` draws (float32) and quantises at a time: a cache of tens of GB
#: then needs one quantised copy beside it while building rather than 16 bytes per element
KEY_CHUNK_ELEMENTS = 1 << 28
#: the dtype that stands for a packed fp4 key or query where helpers take a key dtype
FP4_DTYPE = torch.float4_e2m1fn_x2


# ----------------------------------------------------------------------------- quantise / pack
def quantize_fp8(x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (last dim) symmetric fp8 quantisation: ``x ~= x_fp8.float() * scale[..., None]``.

    Returns ``(x_fp8, scale)`` with ``scale`` fp32 of shape ``x.shape[:-1]``, strictly positive.
    """
    fp8_flavour(dtype)  # validates the dtype
    amax = x.float().abs().amax(dim=-1).clamp_min(1e-12)
    scale = amax / FP8_MAX[dtype]
    x_fp8 = (x.float() / scale.unsqueeze(-1)).clamp(-FP8_MAX[dtype], FP8_MAX[dtype]).to(dtype)
    return x_fp8, scale.float()


def shuffle_block_keys(keys: torch.Tensor) -> torch.Tensor:
    """``[..., kv_block_size, D]`` -> same shape, bytes permuted into the Preshuffle order.

    Byte of (token ``t``, dim ``d``) lands at flat offset
    ``(t // 16) * 16 * D + (d // 16) * 256 + (t % 16) * 16 + (d % 16)`` of the block.
    """
    *lead, kv_block_size, d = keys.shape
    if kv_block_size % SHUFFLE_TILE or d % SHUFFLE_TILE:
        raise ValueError(f"Preshuffle needs kv_block_size and head_dim multiples of 16, got {kv_block_size} and {d}")
    t = SHUFFLE_TILE
    tiles = keys.reshape(*lead, kv_block_size // t, t, d // t, t)  # [.., tg, t, dg, d16]
    return tiles.transpose(-3, -2).contiguous().reshape(*lead, kv_block_size, d)


def unshuffle_block_keys(keys: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`shuffle_block_keys`."""
    *lead, kv_block_size, d = keys.shape
    t = SHUFFLE_TILE
    tiles = keys.reshape(*lead, kv_block_size // t, d // t, t, t)  # [.., tg, dg, t, d16]
    return tiles.transpose(-3, -2).contiguous().reshape(*lead, kv_block_size, d)


def pack_kv_cache(
    keys_fp8: torch.Tensor,
    scales: torch.Tensor,
    *,
    preshuffle: bool = False,
    block_stride: int | None = None,
) -> torch.Tensor:
    """Pack ``keys_fp8 [num_blocks, kv_block_size, D]`` and ``scales [num_blocks, kv_block_size]``
    into the co-packed cache ``[num_blocks, kv_block_size, 1, D + 4]`` uint8. MXFP4 keys pack
    the same way: ``keys_fp8`` their packed bytes ``[.., D / 2]`` uint8, ``scales`` their int32
    exponent words, giving ``[num_blocks, kv_block_size, 1, D / 2 + 4]``.

    ``block_stride`` (bytes, multiple of 4) lets a block occupy more than its packed size, as
    in engines whose cache pages are padded; the padding bytes are filled with 0xFF.
    """
    num_blocks, kv_block_size, d = keys_fp8.shape  # d: key bytes
    packed = kv_block_size * (d + 4)
    stride = packed if block_stride is None else block_stride
    if stride < packed or stride % 4:
        raise ValueError(f"block_stride must be a multiple of 4 and >= {packed}, got {stride}")
    key_bytes = keys_fp8.view(torch.uint8)
    if preshuffle:
        key_bytes = shuffle_block_keys(key_bytes)
    flat = torch.full((num_blocks, stride), 0xFF, dtype=torch.uint8, device=keys_fp8.device)
    flat[:, : kv_block_size * d] = key_bytes.reshape(num_blocks, kv_block_size * d)
    words = scales if scales.dtype == torch.int32 else scales.float()  # fp4 exponents, else fp32 scales
    flat[:, kv_block_size * d : packed] = words.contiguous().view(torch.uint8).reshape(num_blocks, kv_block_size * 4)
    return flat.as_strided((num_blocks, kv_block_size, 1, d + 4), (stride, d + 4, d + 4, 1))


def _block_views(kv_cache: torch.Tensor, kv_block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Strided uint8 views ``keys [num_blocks, kv_block_size * D]`` and
    ``scale_bytes [num_blocks, kv_block_size * 4]``."""
    num_blocks, stride0 = kv_cache.shape[0], kv_cache.stride(0)
    d = kv_cache.shape[-1] - 4
    base = kv_cache.storage_offset()
    keys = kv_cache.as_strided((num_blocks, kv_block_size * d), (stride0, 1), base)
    scales = kv_cache.as_strided((num_blocks, kv_block_size * 4), (stride0, 1), base + kv_block_size * d)
    return keys, scales


def unpack_kv_cache(
    kv_cache: torch.Tensor, *, kv_block_size: int, preshuffle: bool, fp8_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`pack_kv_cache`: ``(keys_fp8 [num_blocks, kv_block_size, D],
    scales [num_blocks, kv_block_size])``;
    with ``fp8_dtype=FP4_DTYPE``, the packed fp4 bytes ``[.., D / 2]`` uint8 and int32 exponent words."""
    d = kv_cache.shape[-1] - SCALE_BYTES
    keys, scale_bytes = _block_views(kv_cache, kv_block_size)
    keys = keys.reshape(-1, kv_block_size, d)
    if preshuffle:
        keys = unshuffle_block_keys(keys)
    fp4 = fp8_dtype == FP4_DTYPE
    scales = scale_bytes.contiguous().view(torch.int32 if fp4 else torch.float32)
    return keys.contiguous().view(torch.uint8 if fp4 else fp8_dtype), scales


# ----------------------------------------------------------------------------- semantics
def _gather_keys(kv_cache, block_ids, kv_block_size, preshuffle, key_dtype):
    """Dequantised keys and scales of the blocks ``block_ids [B, n]``: ``[B, n*kv_block_size, D]``,
    ``[B, n*kv_block_size]``
    (the scales ``None`` for fp4 keys, ``key_dtype=FP4_DTYPE``: their exponents are in the keys)."""
    d = kv_cache.shape[-1] - SCALE_BYTES  # key bytes
    keys, scale_bytes = _block_views(kv_cache, kv_block_size)
    # The rule every backend follows for ids outside [0, num_blocks) that validation did not
    # check (device tensors without PAGED_MQA_LOGITS_CHECK=1): clamped into [0, num_blocks - 1].
    # Entries past a sequence's walked blocks may hold junk too; their positions are masked.
    ids = block_ids.long().clamp(0, max(kv_cache.shape[0] - 1, 0))
    key_blocks = keys[ids].reshape(*ids.shape, kv_block_size, d)
    if preshuffle:
        key_blocks = unshuffle_block_keys(key_blocks)
    key_blocks = key_blocks.reshape(ids.shape[0], -1, d)
    if key_dtype == FP4_DTYPE:
        words = scale_bytes[ids].contiguous().view(torch.int32).reshape(ids.shape[0], -1)
        return dequantize_fp4(key_blocks, words), None
    key_f = key_blocks.contiguous().view(key_dtype).float()
    scale_f = scale_bytes[ids].contiguous().view(torch.float32).reshape(ids.shape[0], -1)
    return key_f, scale_f


def logits_into(
    out: torch.Tensor,
    q_fp8: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    kv_indices: torch.Tensor,
    max_model_len: int,
    *,
    kv_block_size: int,
    preshuffle: bool,
    clean_logits: bool = False,
    max_elements: int = 1 << 25,
    q_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write the logits of every visible position into ``out`` (contract semantics): fp32, or
    bf16 rounded once from fp32. ``q_scale`` given: ``q_fp8`` and the cache hold MXFP4 values.

    Work is done in column chunks whose size depends only on shapes, so it never synchronises
    on a device. On CPU tensors the chunks run up to the longest row (reading the lengths costs
    nothing there) rather than up to ``max_model_len``: every column is then computed by the
    same float operations whatever the output's width, so the same inputs give bit-identical
    logits with a compact or a very wide ``out``. Positions that are not visible keep ``out``'s
    values (or become ``-inf`` with ``clean_logits``). Returns ``out``.
    """
    if q_scale is None:
        q, key_dtype = q_fp8.float(), q_fp8.dtype
    else:
        q, key_dtype = dequantize_fp4(q_fp8, q_scale), FP4_DTYPE
    batch, next_n, heads, d = q.shape
    rows = batch * next_n
    table_width = kv_indices.shape[1] * kv_block_size
    width = min(max_model_len, table_width)
    if kv_cache.shape[0] == 0 or rows == 0:  # validation admits an empty cache only when nothing is visible
        width = table_width = 0
    row_len = row_lengths(context_lens, next_n)  # [B, next_n]
    span = width  # the columns computed
    if row_len.device.type == "cpu" and row_len.numel() and width:
        span = min(table_width, max(0, int(row_len.max())))
    w = weights[:rows].float().reshape(batch, next_n, heads)
    per_column = max(1, batch * next_n * heads + batch * d)
    chunk = max(kv_block_size, (max_elements // per_column) // kv_block_size * kv_block_size)
    for c0 in range(0, min(span, width), chunk):
        c1 = min(c0 + chunk, span)
        b0, b1 = c0 // kv_block_size, math.ceil(c1 / kv_block_size)
        keys, scales = _gather_keys(kv_cache, kv_indices[:, b0:b1], kv_block_size, preshuffle, key_dtype)
        lo = c0 - b0 * kv_block_size
        keys = keys[:, lo : lo + c1 - c0]
        # The kernels' formula, operation for operation: scale * sum_h w * relu(dot) in fp32,
        # the scale applied after the head sum, relu = IEEE maxNum(dot, 0) as the GPU max
        # instructions compute it (a NaN dot gives 0; NaN weights or scales propagate). fp4 keys
        # have no per-token scale: their exponents are part of the dequantised values.
        scores = torch.einsum("bjhd,bpd->bjhp", q, keys)
        relu = torch.fmax(scores, scores.new_zeros(()))
        logits = (relu * w[..., None]).sum(dim=2)  # [B, next_n, P]
        if scales is not None:
            logits = logits * scales[:, None, lo : lo + c1 - c0]
        end = min(c1, width)  # columns past max_model_len are computed (see above), never written
        cols = torch.arange(c0, end, device=out.device)
        visible = (cols[None, None, :] < row_len[..., None]).reshape(rows, end - c0)
        target = out[:rows, c0:end]
        fill = torch.full_like(target, float("-inf")) if clean_logits else target
        target.copy_(torch.where(visible, logits.reshape(rows, c1 - c0)[:, : end - c0].to(out.dtype), fill))
    computed = min(span, width)
    if clean_logits and computed < max_model_len:
        out[:rows, computed:max_model_len] = float("-inf")
    return out


def reference_logits(
    q_fp8: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    kv_indices: torch.Tensor,
    max_model_len: int,
    *,
    kv_block_size: int,
    preshuffle: bool = False,
    q_scale: torch.Tensor | None = None,
    logits_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``[B * next_n, max_model_len]`` of ``logits_dtype`` (float32, or bfloat16: the float32 logit
    rounded once): the logit at visible positions, ``-inf`` elsewhere. ``q_scale`` given: MXFP4
    inputs (``q_fp8`` packed, the cache in the fp4 layout)."""
    rows = q_fp8.shape[0] * q_fp8.shape[1]
    out = torch.full((rows, max_model_len), float("-inf"), dtype=logits_dtype, device=q_fp8.device)
    return logits_into(
        out, q_fp8, kv_cache, weights, context_lens, kv_indices, max_model_len,
        kv_block_size=kv_block_size, preshuffle=preshuffle, q_scale=q_scale,
    )


def tensor_head_sum(scores: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The arithmetic of ``HeadSum=tensor`` (docs/CONTRACT.md) on ``scores [..., H]`` (fp32 dots,
    before the key scale) and ``weights [H]``: ``relu(score)`` rounded to bf16, each weight split
    into ``hi = bf16(w)`` and ``lo = bf16(w - hi)``, the products summed in fp32."""
    relu = scores.float().relu().to(torch.bfloat16).float()
    hi = weights.float().to(torch.bfloat16)
    lo = (weights.float() - hi.float()).to(torch.bfloat16)
    return (relu * hi.float()).sum(-1) + (relu * lo.float()).sum(-1)


def valid_mask(context_lens: torch.Tensor, next_n: int, max_model_len: int, table_width: int) -> torch.Tensor:
    """``[B * next_n, max_model_len]`` bool: True where the row sees the column."""
    row_len = row_lengths(context_lens, next_n).reshape(-1)
    cols = torch.arange(max_model_len, device=context_lens.device)
    return (cols[None, :] < row_len[:, None]) & (cols[None, :] < table_width)


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """``1 - 2 sum(xy) / sum(x^2 + y^2)`` in float64 (0 = identical); docs/BENCHMARK.md."""
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    if denom == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denom)


@dataclass
class Check:
    """Outcome of comparing an op's output with the reference (docs/BENCHMARK.md)."""

    calc_diff: float  # on the valid positions
    untouched: bool  # every non-valid element of out equals its value before the call, bit for bit (any dtype)
    valid_count: int

    @property
    def ok(self) -> bool:
        return self.untouched and self.calc_diff < 1e-3

    def describe(self) -> str:
        return (f"{self.valid_count} logits, calc_diff={self.calc_diff:.2e}, "
                f"untouched elsewhere: {'yes' if self.untouched else 'NO'} -> {'PASS' if self.ok else 'FAIL'}")


def check_logits(out: torch.Tensor, before: torch.Tensor, ref: torch.Tensor, *, clean_logits: bool = False) -> Check:
    """Compare ``out`` (after the call) with ``ref`` (:func:`reference_logits`), given a copy
    ``before`` of ``out`` taken before the call. With ``clean_logits`` the cleaned columns
    ``[valid_end, max_model_len)`` must be ``-inf`` instead of untouched."""
    rows, width = ref.shape
    valid = torch.isfinite(ref)
    got = out[:rows, :width]
    diff = calc_diff(got[valid], ref[valid]) if bool(valid.any()) else 0.0
    if bool(torch.isnan(got[valid]).any()):
        diff = float("inf")
    expected = before.clone()
    expected[:rows, :width] = torch.where(valid, got, float("-inf") if clean_logits else before[:rows, :width])
    bits = {4: torch.int32, 2: torch.int16}[out.element_size()]
    untouched = torch.equal(out.view(bits), expected.view(bits))
    return Check(diff, untouched, int(valid.sum()))


# ----------------------------------------------------------------------------- synthetic inputs
def _random_keys(num_blocks: int, kv_block_size: int, head_dim: int, kv_format: str, fp8_dtype: torch.dtype,
                 gen: torch.Generator, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantised normal keys ``[num_blocks, kv_block_size, head_dim]`` and their scales, drawn
    :data:`KEY_CHUNK_ELEMENTS` at a time (each token's scale depends on its own key only, so
    the chunks quantise exactly as one draw would; a cache of one chunk is that one draw)."""
    step = max(1, KEY_CHUNK_ELEMENTS // (kv_block_size * head_dim))
    keys_q = key_scales = None
    for first in range(0, num_blocks, step):
        keys = torch.randn(min(step, num_blocks - first), kv_block_size, head_dim, generator=gen, device=dev)
        part_q, part_scales = quantize_fp8(keys, fp8_dtype) if kv_format == "fp8" else quantize_fp4(keys)
        del keys
        if first == 0 and step >= num_blocks:
            return part_q, part_scales
        if keys_q is None:
            keys_q = part_q.new_empty((num_blocks, *part_q.shape[1:]))
            key_scales = part_scales.new_empty((num_blocks, *part_scales.shape[1:]))
        keys_q[first:first + len(part_q)] = part_q
        key_scales[first:first + len(part_scales)] = part_scales
    return keys_q, key_scales


def make_inputs(
    batch: int,
    next_n: int,
    heads: int,
    context_lens,
    *,
    kv_block_size: int = 64,
    preshuffle: bool = False,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    lens_2d: bool = True,
    max_model_len: int | None = None,
    device="cpu",
    seed: int = 0,
    block_stride_pad: int = 0,
    table_pad: int = 0,
    table_row_pad: int = 0,
    out_row_pad: int = 0,
    out_fill: float = float("nan"),
    head_dim: int = HEAD_DIM,
    kv_format: str = "fp8",
    logits_dtype: torch.dtype = torch.float32,
) -> dict:
    """Synthetic inputs with an honest memory footprint (docs/BENCHMARK.md).

    Every block of every sequence is its own (no two sequences or positions share one, so the
    cache holds every token's key once), placed in the cache through a random permutation.
    ``context_lens`` is an int (uniform) or a list of ``batch`` ints (``L_b``). Block-table
    entries past a sequence hold ``-1`` so a kernel that reads them faults or shows up in tests.
    ``kv_format="fp4"`` quantises queries and keys to MXFP4 (``q_fp8`` packed, ``q_scale`` its
    exponents; ``fp8_dtype`` is then unused); ``out_logits`` is of ``logits_dtype``.

    Returns a dict: the op's positional arguments under their names (``q_fp8``, ``kv_cache``,
    ``weights``, ``out_logits``, ``context_lens``, ``kv_indices``, ``max_model_len``), ``q_scale``
    (``None`` for fp8), and the
    layout as ``kv_block_size`` and ``preshuffle``, which the op takes as ``KVBlockSize`` and
    ``Preshuffle`` (so ``op(**inputs)`` does not work: pass them by position, then
    ``Preshuffle=inputs["preshuffle"], KVBlockSize=inputs["kv_block_size"]``). Tensors keep their
    strides on ``device``.
    """
    if kv_format not in KV_FORMATS:
        raise ValueError(f"kv_format must be one of {', '.join(KV_FORMATS)}, got {kv_format!r}")
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(seed)  # generated where it is used: GB-sized caches
    lens = [int(context_lens)] * batch if isinstance(context_lens, int) else [int(x) for x in context_lens]
    if len(lens) != batch:
        raise ValueError(f"context_lens has {len(lens)} entries for batch {batch}")
    blocks_per_seq = [math.ceil(n / kv_block_size) for n in lens]
    num_blocks = max(1, sum(blocks_per_seq))
    max_len = max(lens + [1])
    if max_model_len is None:
        max_model_len = max_len
    max_blocks = max(1, math.ceil(max(max_len, max_model_len) / kv_block_size)) + table_pad
    perm = torch.randperm(num_blocks, generator=gen, device=dev).int()
    table = torch.full((batch, max_blocks + table_row_pad), -1, dtype=torch.int32, device=dev)
    starts = [0]
    for n in blocks_per_seq:
        starts.append(starts[-1] + n)
    cols = torch.arange(max_blocks, device=dev)
    counts = torch.tensor(blocks_per_seq, device=dev)
    index = (torch.tensor(starts[:-1], device=dev)[:, None] + cols[None, :]).clamp_max(num_blocks - 1)
    table[:, :max_blocks] = torch.where(cols[None, :] < counts[:, None], perm[index], -1)
    kv_indices = table[:, :max_blocks]

    keys_q, key_scales = _random_keys(num_blocks, kv_block_size, head_dim, kv_format, fp8_dtype, gen, dev)
    packed = kv_block_size * (key_bytes(head_dim, kv_format) + SCALE_BYTES)
    kv_cache = pack_kv_cache(keys_q, key_scales, preshuffle=preshuffle, block_stride=packed + block_stride_pad)
    del keys_q

    q_scale = None
    if kv_format == "fp8":
        fp8_max = FP8_MAX[fp8_dtype]
        q = torch.randn(batch, next_n, heads, head_dim, generator=gen, device=dev) * 0.25 * fp8_max / 4
        q = q.clamp(-fp8_max, fp8_max)
        q_fp8 = q.to(fp8_dtype)
    else:
        q_fp8, q_scale = quantize_fp4(torch.randn(batch, next_n, heads, head_dim, generator=gen, device=dev))
    weights = torch.randn(batch * next_n, heads, generator=gen, device=dev) / math.sqrt(heads)

    lens_t = torch.tensor(lens, dtype=torch.int32, device=dev)
    if lens_2d:
        offsets = torch.arange(next_n, dtype=torch.int32, device=dev) - (next_n - 1)
        lens_t = (lens_t[:, None] + offsets[None, :]).clamp_min(0).to(torch.int32)

    out = torch.full((batch * next_n + out_row_pad, max_model_len + 8), out_fill, dtype=logits_dtype, device=dev)
    return {
        "q_fp8": q_fp8,
        "q_scale": q_scale,
        "kv_cache": kv_cache,
        "weights": weights,
        "out_logits": out,
        "context_lens": lens_t,
        "kv_indices": kv_indices,
        "max_model_len": max_model_len,
        "kv_block_size": kv_block_size,
        "preshuffle": preshuffle,
    }
