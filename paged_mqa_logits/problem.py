"""The host-side problem key and the normalised arguments every backend receives.

Everything here is built from tensor *metadata* (shapes, dtypes, strides, devices) and host
ints. Nothing reads a device value, so building a problem never synchronises the device.

Row semantics shared by every backend (docs/CONTRACT.md):

* query row ``r = b * next_n + j`` of sequence ``b``;
* 1-D lengths ``[B]``: ``row_len(b, j) = max(L_b - next_n + j + 1, 0)`` and the sequence
  length that sizes the work is ``L_b``;
* 2-D lengths ``[B, next_n]``: ``row_len(b, j) = max(lens[b, j], 0)`` and the sequence length
  is ``max_j row_len(b, j)`` (never only ``lens[b, 0]``);
* a position ``p`` is *visible* to row ``(b, j)`` when ``p < row_len(b, j)``,
  ``p < max_model_len`` and ``p < max_blocks * kv_block_size`` (a position past the block
  table's width has no block to read, so it is never read and never written);
* ``valid_end(r) = min(row_len, max_model_len, max_blocks * kv_block_size)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

HEAD_DIM = 128
SUPPORTED_KV_BLOCK_SIZES = (1, 16, 32, 64, 128, 256)
MAX_NEXT_N = 8


def row_lengths(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """``[B, next_n]`` int64 visible length of every query row (the row rule above)."""
    lens = context_lens.long()
    if lens.dim() == 1:
        offsets = torch.arange(next_n, device=lens.device) - (next_n - 1)
        return (lens[:, None] + offsets[None, :]).clamp_min(0)
    return lens.clamp_min(0)


def fp8_flavour(dtype: torch.dtype) -> str:
    """``"fn"`` for e4m3fn (OCP: gfx950, Hopper, Blackwell), ``"fnuz"`` for e4m3fnuz (gfx942)."""
    if dtype == torch.float8_e4m3fn:
        return "fn"
    if dtype == torch.float8_e4m3fnuz:
        return "fnuz"
    raise ValueError(f"not an fp8 e4m3 dtype: {dtype}")


def fp8_dtype(flavour: str) -> torch.dtype:
    return {"fn": torch.float8_e4m3fn, "fnuz": torch.float8_e4m3fnuz}[flavour]


@dataclass(frozen=True)
class Problem:
    """Everything dispatch may look at. Hashable: it is the dispatch-cache key.

    ``context`` is the caller's host-side hint (longest context in the batch) or ``None``.
    """

    arch: str  # "sm_90", "gfx942", "gfx950", "cpu", ...
    cu_num: int  # CUs (ROCm) or SMs (CUDA); 0 on CPU
    batch: int
    next_n: int
    heads: int
    head_dim: int
    kv_block_size: int
    preshuffle: bool
    context: int | None
    lens_2d: bool
    fp8: str  # "fn" | "fnuz"
    device_type: str  # torch device type: "cpu" | "cuda" (ROCm reports "cuda" too)
    max_model_len: int
    #: True for problems described rather than called (``explain``, ``compile --only-table``):
    #: backends then judge only arch and shapes, not whether this machine could run them.
    hypothetical: bool = False
    #: cache layout, as far as kernels compile differently for it: the block stride in bytes
    #: (``kv_cache.stride(0)``; 0 = packed, ``kv_block_size * (head_dim + 4)``), whether the
    #: cache's first byte is 16-byte aligned, and whether every cache byte lies within 2^31 of
    #: it (32-bit offsets; see :func:`kv_fits_32bit`). Described problems assume a packed,
    #: aligned cache under 2 GiB.
    kv_block_stride: int = 0
    kv_base_aligned: bool = True
    kv_32bit: bool = True

    @property
    def kv_stride_bytes(self) -> int:
        return self.kv_block_stride or self.kv_block_size * (self.head_dim + 4)

    @property
    def kv_aligned16(self) -> bool:
        """Every block starts 16-byte aligned: base and block stride are 16-byte multiples."""
        return self.kv_base_aligned and self.kv_stride_bytes % 16 == 0

    @property
    def rows(self) -> int:
        return self.batch * self.next_n

    @property
    def work_context(self) -> int:
        """Context used to size host-side decisions: the hint, else the output width."""
        return self.context if self.context is not None else self.max_model_len

    def describe(self) -> str:
        ctx = "any" if self.context is None else str(self.context)
        return (
            f"arch={self.arch} cu_num={self.cu_num} batch={self.batch} next_n={self.next_n} "
            f"heads={self.heads} head_dim={self.head_dim} kv_block_size={self.kv_block_size} "
            f"preshuffle={int(self.preshuffle)} context={ctx}"
        )


def kv_fits_32bit(kv_cache) -> bool:
    """Every byte a gather can touch lies within 2^31 of the cache view's base (AMD buffer
    loads take 32-bit offsets): blocks ``[0, num_blocks)`` of ``stride(0)`` bytes each."""
    n, stride0 = kv_cache.shape[0], kv_cache.stride(0)
    block_bytes = kv_cache.shape[1] * kv_cache.shape[3]
    return max(n - 1, 0) * stride0 + block_bytes < 2**31 - 1


@dataclass
class LaunchArgs:
    """Validated arguments of one call, in the exact form the contract defines.

    Backends read the tensors as they are (views, strides and all); they never copy the KV
    cache. ``kv_cache`` is ``[num_blocks, kv_block_size, 1, head_dim + 4]`` uint8 whose block
    stride ``kv_cache.stride(0)`` (bytes) may exceed ``kv_block_size * (head_dim + 4)``.
    """

    q: torch.Tensor  # [B, next_n, H, D] fp8
    kv_cache: torch.Tensor  # [num_blocks, kv_block_size, 1, D + 4] uint8
    weights: torch.Tensor  # [B * next_n, H] fp32
    out: torch.Tensor  # [>= B * next_n, >= max_model_len] fp32
    context_lens: torch.Tensor  # [B] or [B, next_n] int32
    block_table: torch.Tensor  # [B, max_blocks] int32
    max_model_len: int
    kv_block_size: int
    preshuffle: bool
    problem: Problem

    @property
    def max_blocks(self) -> int:
        return self.block_table.shape[1]

    @property
    def num_blocks(self) -> int:
        return self.kv_cache.shape[0]

    @property
    def visible_width(self) -> int:
        """Columns any row can see: ``min(max_model_len, max_blocks * kv_block_size)``."""
        return min(self.max_model_len, self.max_blocks * self.kv_block_size)
