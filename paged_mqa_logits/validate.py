"""Host-side validation of one call: shapes, dtypes, devices, strides. Never reads device values.

Every error names the argument, what was expected and what was given, and is raised before
anything is written.
"""

from __future__ import annotations

import torch

from . import arch as arch_mod
from .problem import HEAD_DIM, MAX_NEXT_N, SUPPORTED_KV_BLOCK_SIZES, LaunchArgs, Problem, fp8_flavour, kv_fits_32bit


class PagedMQAArgumentError(ValueError):
    """A call argument violates the contract; raised before ``out_logits`` is touched."""


def _fail(name: str, expected: str, got) -> None:
    raise PagedMQAArgumentError(f"paged_mqa_logits: argument `{name}`: expected {expected}, got {got}")


def _tensor(name: str, value, dtypes: tuple, ndims: tuple) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        _fail(name, "a torch.Tensor", type(value).__name__)
    if value.dtype not in dtypes:
        _fail(name, "dtype " + " or ".join(str(d).replace("torch.", "") for d in dtypes), str(value.dtype).replace("torch.", ""))
    if value.dim() not in ndims:
        _fail(name, " or ".join(f"{n}-D" for n in ndims) + " tensor", f"shape {tuple(value.shape)}")
    return value


def _last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        _fail(name, "a contiguous last dimension (stride 1)", f"stride {t.stride(-1)}")


def _host_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(name, "a Python int", type(value).__name__)
    if value < minimum:
        _fail(name, f"an int >= {minimum}", value)
    return value


def build_launch_args(
    q_fp8,
    kv_cache,
    weights,
    out_logits,
    context_lens,
    kv_indices,
    max_model_len,
    Preshuffle=False,
    KVBlockSize=1,
    context_hint=None,
) -> LaunchArgs:
    """Validate a call and return its :class:`LaunchArgs` (problem key included)."""
    fp8_types = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
    q = _tensor("q_fp8", q_fp8, fp8_types, (4,))
    batch, next_n, heads, head_dim = q.shape
    if head_dim != HEAD_DIM:
        _fail("q_fp8", f"head_dim (dim 3) == {HEAD_DIM}", head_dim)
    if not 1 <= next_n <= MAX_NEXT_N:
        _fail("q_fp8", f"next_n (dim 1) in 1..{MAX_NEXT_N}", next_n)
    if heads < 16 or heads % 16:
        _fail("q_fp8", "heads (dim 2) a positive multiple of 16 (32 for GLM-5, 64 for DeepSeek-V3.2)", heads)
    _last_dim_contiguous("q_fp8", q)
    device = q.device

    if not isinstance(Preshuffle, bool):
        _fail("Preshuffle", "a bool", type(Preshuffle).__name__)
    block_size = _host_int("KVBlockSize", KVBlockSize, 1)
    if block_size not in SUPPORTED_KV_BLOCK_SIZES:
        _fail("KVBlockSize", "one of " + ", ".join(map(str, SUPPORTED_KV_BLOCK_SIZES)), block_size)
    if Preshuffle and block_size % 16:
        _fail("KVBlockSize", "a multiple of 16 when Preshuffle=True", block_size)
    max_model_len = _host_int("max_model_len", max_model_len, 0)
    if context_hint is not None:
        context_hint = _host_int("context_hint", context_hint, 0)

    kv = _tensor("kv_cache", kv_cache, (torch.uint8,), (4,))
    expected_shape = f"[num_blocks, KVBlockSize={block_size}, 1, {head_dim + 4}]"
    if kv.shape[1] != block_size or kv.shape[2] != 1 or kv.shape[3] != head_dim + 4:
        _fail("kv_cache", f"shape {expected_shape}", f"shape {tuple(kv.shape)}")
    packed = block_size * (head_dim + 4)
    if kv.stride(3) != 1 or (block_size > 1 and kv.stride(1) != head_dim + 4):
        _fail("kv_cache", "every block packed contiguously (strides [*, D+4, *, 1])", f"strides {kv.stride()}")
    if kv.shape[0] > 1 and (kv.stride(0) < packed or kv.stride(0) % 4):
        _fail("kv_cache", f"a block stride (stride(0)) that is a multiple of 4 and >= {packed} bytes", kv.stride(0))
    if kv.storage_offset() % 4:
        _fail("kv_cache", "a storage offset that is a multiple of 4 bytes (fp32 scales)", kv.storage_offset())

    rows = batch * next_n
    w = _tensor("weights", weights, (torch.float32,), (2,))
    if tuple(w.shape) != (rows, heads):
        _fail("weights", f"shape [B*next_n={rows}, H={heads}]", f"shape {tuple(w.shape)}")
    _last_dim_contiguous("weights", w)

    out = _tensor("out_logits", out_logits, (torch.float32,), (2,))
    if out.shape[0] < rows:
        _fail("out_logits", f"at least B*next_n={rows} rows", f"{out.shape[0]} rows")
    if out.shape[1] < max_model_len:
        _fail("out_logits", f"at least max_model_len={max_model_len} columns", f"{out.shape[1]} columns")
    _last_dim_contiguous("out_logits", out)

    lens = _tensor("context_lens", context_lens, (torch.int32,), (1, 2))
    lens_shape = (batch,) if lens.dim() == 1 else (batch, next_n)
    if tuple(lens.shape) != lens_shape:
        _fail("context_lens", f"shape [B={batch}] or [B={batch}, next_n={next_n}]", f"shape {tuple(lens.shape)}")

    table = _tensor("kv_indices", kv_indices, (torch.int32,), (2,))
    if table.shape[0] != batch:
        _fail("kv_indices", f"{batch} rows (one per sequence)", f"shape {tuple(table.shape)}")
    _last_dim_contiguous("kv_indices", table)

    for name, t in (("kv_cache", kv), ("weights", w), ("out_logits", out), ("context_lens", lens), ("kv_indices", table)):
        if t.device != device:
            _fail(name, f"a tensor on {device} (the device of q_fp8)", f"a tensor on {t.device}")

    info = arch_mod.detect(device)
    flavour = fp8_flavour(q.dtype)
    if not info.supports_fp8(flavour):
        _fail("q_fp8", f"the fp8 flavour native to {info.arch} "
              f"({'e4m3fnuz' if arch_mod.NATIVE_FP8.get(info.arch) == 'fnuz' else 'e4m3fn'})",
              str(q.dtype).replace("torch.", ""))

    problem = Problem(
        arch=info.arch, cu_num=info.cu_num, batch=batch, next_n=next_n, heads=heads, head_dim=head_dim,
        kv_block_size=block_size, preshuffle=Preshuffle, context=context_hint, lens_2d=lens.dim() == 2,
        fp8=flavour, device_type=device.type, max_model_len=max_model_len,
        # a packed stride (or a single block) is the described default, 0: keys stay comparable
        kv_block_stride=0 if kv.shape[0] == 1 or kv.stride(0) == block_size * (head_dim + 4) else kv.stride(0),
        kv_base_aligned=kv.data_ptr() % 16 == 0, kv_32bit=kv_fits_32bit(kv),
    )
    return LaunchArgs(q, kv, w, out, lens, table, max_model_len, block_size, Preshuffle, problem)
