"""Host-side validation of one call: shapes, dtypes, devices, strides, aliasing, block ids.

Every error names the argument, what was expected and what was given, and is raised before
anything is written.

Block-table ids are checked where that costs no device synchronisation: always on CPU tensors,
and on device tensors only with ``PAGED_MQA_LOGITS_CHECK=1`` (read at import; or set
:data:`CHECK_DEVICE_IDS`), which synchronises once per call. Unchecked ids outside
``[0, num_blocks)`` are clamped into ``[0, num_blocks - 1]`` by every backend: they read a
wrong block, never outside the cache.
"""

from __future__ import annotations

import os

import torch

from . import arch as arch_mod
from .errors import PagedMQAArgumentError, env_flag
from .problem import (HEAD_DIM, KV_FORMATS, LOGITS_DTYPES, MAX_NEXT_N, SUPPORTED_KV_BLOCK_SIZES, LaunchArgs, Problem,
                      ShapeKey, fp8_flavour, key_bytes, kv_fits_32bit, logits_dtype_name, token_bytes)


ENV_CHECK = "PAGED_MQA_LOGITS_CHECK"

#: check the block-table ids of device tensors too (one synchronisation per call)
CHECK_DEVICE_IDS = env_flag(ENV_CHECK, os.environ.get(ENV_CHECK))


def fail(name: str, expected: str, got) -> None:
    """Raise the :class:`PagedMQAArgumentError` naming argument ``name``, what it expects and what
    it got; every argument check of the package (the top-k op's too) reports through it."""
    raise PagedMQAArgumentError(f"paged_mqa_logits: argument `{name}`: expected {expected}, got {got}")


def tensor(name: str, value, dtypes: tuple, ndims: tuple) -> torch.Tensor:
    """``value``, checked to be a torch.Tensor of one of ``dtypes`` with one of ``ndims`` dimensions."""
    if not isinstance(value, torch.Tensor):
        fail(name, "a torch.Tensor", type(value).__name__)
    if value.dtype not in dtypes:
        fail(name, "dtype " + " or ".join(str(d).replace("torch.", "") for d in dtypes), str(value.dtype).replace("torch.", ""))
    if value.dim() not in ndims:
        fail(name, " or ".join(f"{n}-D" for n in ndims) + " tensor", f"shape {tuple(value.shape)}")
    return value


def last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    """Check that ``t``'s last dimension has stride 1 (where it has more than one element)."""
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        fail(name, "a contiguous last dimension (stride 1)", f"stride {t.stride(-1)}")


def host_int(name: str, value, minimum: int, maximum: int | None = None) -> int:
    """``value``, checked to be a Python int (not a bool) in ``minimum..maximum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        fail(name, "a Python int", type(value).__name__)
    if value < minimum or (maximum is not None and value > maximum):
        fail(name, f"an int >= {minimum}" if maximum is None else f"an int in {minimum}..{maximum}", value)
    return value


#: the widest ``max_model_len``: positions are int32 on every path, as ``context_lens`` are, so
#: no row sees a column past it (a larger value only asks for memory)
MAX_MODEL_LEN = 2**31 - 1


MAX_MODEL_LEN_EXPECTED = f"an int in 0..{MAX_MODEL_LEN} (positions are int32)"


def max_model_len_rule(max_model_len: int) -> str | None:
    return None if 0 <= max_model_len <= MAX_MODEL_LEN else MAX_MODEL_LEN_EXPECTED


# ----------------------------------------------------------------------------- shape rules
# One home for the rules on a call's shape properties: the op applies them to its tensors'
# dimensions, ``explain`` (and the CLI) to the numbers it is given. Each returns what was
# expected, or ``None`` when the value is fine.
def head_dim_rule(head_dim: int) -> str | None:
    return None if head_dim == HEAD_DIM else f"== {HEAD_DIM}"


def next_n_rule(next_n: int) -> str | None:
    return None if 1 <= next_n <= MAX_NEXT_N else f"in 1..{MAX_NEXT_N}"


def heads_rule(heads: int) -> str | None:
    ok = heads >= 16 and heads % 16 == 0
    return None if ok else "a positive multiple of 16 (32 for GLM-5, 64 for DeepSeek-V3.2)"


def kv_block_size_rule(kv_block_size: int, preshuffle: bool) -> str | None:
    if kv_block_size not in SUPPORTED_KV_BLOCK_SIZES:
        return "one of " + ", ".join(map(str, SUPPORTED_KV_BLOCK_SIZES))
    if preshuffle and kv_block_size % 16:
        return "a multiple of 16 when Preshuffle=True"
    return None


def arch_rule(arch: str, known) -> str | None:
    """The one answer every command gives for an arch it does not serve (``known``: the archs
    it does)."""
    return None if arch in known else "one of " + ", ".join(sorted(known))


def check_problem(*, arch: str | None, cu_num: int | None, batch: int, next_n: int, heads: int, head_dim: int,
                  kv_block_size: int, preshuffle: bool, context: int | None, names: dict[str, str],
                  prefix: str = "", known_archs=None, kv_format: str = "fp8", logits_dtype: str = "fp32") -> None:
    """The op's rules applied to a problem described by numbers (``explain``, the CLI).

    ``names`` maps each field (``arch``, ``cu_num``, ``batch``, ``next_n``, ``heads``,
    ``head_dim``, ``kv_block_size``, ``context``, ``kv_format``, ``logits_dtype``) to the name
    the caller knows it by, so an
    error names the option the user typed. A described problem has at least one sequence;
    ``arch``/``cu_num`` of ``None`` are not checked (a real device supplies them); ``arch``
    must be one of ``known_archs`` (default: the arch table, ``arch.USUAL_CU_NUM``).
    """
    def check(field: str, expected: str | None, got) -> None:
        if expected is not None:
            raise PagedMQAArgumentError(f"{prefix}argument {names.get(field, field)}: expected {expected}, got {got}")

    if arch is not None:
        check("arch", arch_rule(arch, known_archs if known_archs is not None else arch_mod.USUAL_CU_NUM), arch)
    if cu_num is not None:
        minimum = 0 if arch == "cpu" else 1
        check("cu_num", None if cu_num >= minimum else f"an int >= {minimum}", cu_num)
    check("batch", None if batch >= 1 else "an int >= 1", batch)
    check("next_n", next_n_rule(next_n), next_n)
    check("heads", heads_rule(heads), heads)
    check("head_dim", head_dim_rule(head_dim), head_dim)
    check("kv_block_size", kv_block_size_rule(kv_block_size, preshuffle), kv_block_size)
    check("kv_format", kv_format_rule(kv_format), repr(kv_format))
    check("logits_dtype", logits_dtype_rule(logits_dtype), repr(logits_dtype))
    if context is not None:
        check("context", None if context >= 0 else "an int >= 0", context)


#: dtypes of an fp8 query, and of a packed fp4 query (two e2m1 codes per byte)
FP8_TYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
FP4_TYPES = (torch.uint8, torch.float4_e2m1fn_x2)


def kv_format_rule(kv_format: str) -> str | None:
    return None if kv_format in KV_FORMATS else "one of " + ", ".join(KV_FORMATS)


def logits_dtype_rule(logits_dtype: str) -> str | None:
    return None if logits_dtype in LOGITS_DTYPES else "one of " + ", ".join(LOGITS_DTYPES)


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
    q_scale=None,
    clean_logits=False,
) -> LaunchArgs:
    """Validate a call and return its :class:`LaunchArgs` (problem key included, and whether
    the call wants ``clean_logits``' ``-inf``)."""
    q, q_scale, kv_format = _query(q_fp8, q_scale)
    batch, next_n, heads = q.shape[:3]
    head_dim = HEAD_DIM
    device = q.device

    if not isinstance(Preshuffle, bool):
        fail("Preshuffle", "a bool", type(Preshuffle).__name__)
    kv_block_size = host_int("KVBlockSize", KVBlockSize, 1)
    expected = kv_block_size_rule(kv_block_size, Preshuffle)
    if expected is not None:
        fail("KVBlockSize", expected, kv_block_size)
    max_model_len = host_int("max_model_len", max_model_len, 0, MAX_MODEL_LEN)
    if context_hint is not None:
        context_hint = host_int("context_hint", context_hint, 0)
    if not isinstance(clean_logits, bool):
        fail("clean_logits", "a bool", repr(clean_logits))

    row = token_bytes(head_dim, kv_format)
    kv = _cache(kv_cache, kv_block_size, row, kv_format)

    rows = batch * next_n
    w = tensor("weights", weights, (torch.float32,), (2,))
    if tuple(w.shape) != (rows, heads):
        fail("weights", f"shape [B*next_n={rows}, H={heads}]", f"shape {tuple(w.shape)}")
    last_dim_contiguous("weights", w)

    out = tensor("out_logits", out_logits, tuple(LOGITS_DTYPES.values()), (2,))
    if out.shape[0] < rows:
        fail("out_logits", f"at least B*next_n={rows} rows", f"{out.shape[0]} rows")
    if out.shape[1] < max_model_len:
        fail("out_logits", f"at least max_model_len={max_model_len} columns", f"{out.shape[1]} columns")
    last_dim_contiguous("out_logits", out)

    lens = tensor("context_lens", context_lens, (torch.int32,), (1, 2))
    lens_shape = (batch,) if lens.dim() == 1 else (batch, next_n)
    if tuple(lens.shape) != lens_shape:
        fail("context_lens", f"shape [B={batch}] or [B={batch}, next_n={next_n}]", f"shape {tuple(lens.shape)}")

    table = tensor("kv_indices", kv_indices, (torch.int32,), (2,))
    if table.shape[0] != batch:
        fail("kv_indices", f"{batch} rows (one per sequence)", f"shape {tuple(table.shape)}")
    last_dim_contiguous("kv_indices", table)

    inputs = [("q_fp8", q), ("kv_cache", kv), ("weights", w), ("context_lens", lens), ("kv_indices", table)]
    if q_scale is not None:
        inputs.append(("q_scale", q_scale))
    for name, t in inputs[1:3] + [("out_logits", out)] + inputs[3:]:
        if t.device != device:
            fail(name, f"a tensor on {device} (the device of q_fp8)", f"a tensor on {t.device}")

    if device.type == "meta":
        fail("q_fp8", "tensors with data on a CPU or GPU device", "meta tensors")
    if kv.shape[0] == 0 and device.type != "cpu" and rows and max_model_len and table.shape[1]:
        # Without reading the lengths (a sync) any row may walk a block, and there is none to
        # clamp to; on CPU the id check below decides from the actual lengths.
        fail("kv_cache", "at least one block (num_blocks >= 1)", "num_blocks 0")
    check_no_overlap(out, rows, max_model_len, inputs)
    if device.type == "cpu" or CHECK_DEVICE_IDS:
        check_block_ids(lens, table, next_n, kv_block_size, max_model_len, kv.shape[0])

    info = arch_mod.detect(device)
    if kv_format == "fp8":
        flavour = fp8_flavour(q.dtype)
        if not info.supports_fp8(flavour):
            fail("q_fp8", f"the fp8 flavour native to {info.arch} "
                  f"({'e4m3' + arch_mod.native_fp8(info.arch)})",
                  str(q.dtype).replace("torch.", ""))
    else:  # fp4 has no flavour; kernels that widen e2m1 to e4m3 use the chip's native one
        flavour = arch_mod.native_fp8(info.arch)

    shape_key = ShapeKey(heads=heads, head_dim=head_dim, kv_block_size=kv_block_size, preshuffle=Preshuffle,
                         batch=batch, next_n=next_n, kv_format=kv_format, logits_dtype=logits_dtype_name(out.dtype))
    problem = Problem(
        arch=info.arch, cu_num=info.cu_num, shape_key=shape_key, context=context_hint, lens_2d=lens.dim() == 2,
        fp8=flavour, max_model_len=max_model_len,
        # a packed stride (or a single block) is the described default, 0: keys stay comparable
        kv_block_stride=0 if kv.shape[0] == 1 or kv.stride(0) == kv_block_size * row else kv.stride(0),
        kv_base_aligned=kv.data_ptr() % 16 == 0, kv_32bit=kv_fits_32bit(kv),
    )
    return LaunchArgs(q, kv, w, out, lens, table, max_model_len, problem, clean_logits=clean_logits, q_scale=q_scale)


def _query(q_fp8, q_scale) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    """``(q, q_scale, kv_format)``: an fp8 query without exponents, or a packed fp4 query (as
    uint8) with its ``[B, next_n, H]`` int32 exponents."""
    if q_scale is None:
        if isinstance(q_fp8, torch.Tensor) and q_fp8.dtype in FP4_TYPES:
            fail("q_scale", "a [B, next_n, H] int32 tensor of ue8m0 exponents for a packed fp4 q_fp8", "None")
        q = tensor("q_fp8", q_fp8, FP8_TYPES, (4,))
        kv_format = "fp8"
    else:
        q = tensor("q_fp8", q_fp8, FP4_TYPES, (4,))
        kv_format = "fp4"
    batch, next_n, heads, dim = q.shape
    width = key_bytes(HEAD_DIM, kv_format)
    for what, rule, value in (("head_dim (dim 3)" if kv_format == "fp8" else "packed bytes (dim 3)",
                               lambda n: None if n == width else f"== {width}", dim),
                              ("next_n (dim 1)", next_n_rule, next_n), ("heads (dim 2)", heads_rule, heads)):
        expected = rule(value)
        if expected is not None:
            fail("q_fp8", f"{what} {expected}", value)
    last_dim_contiguous("q_fp8", q)
    if q_scale is None:
        return q, None, kv_format
    scale = tensor("q_scale", q_scale, (torch.int32,), (3,))
    if tuple(scale.shape) != (batch, next_n, heads):
        fail("q_scale", f"shape [B={batch}, next_n={next_n}, H={heads}] (q_fp8's first three)",
              f"shape {tuple(scale.shape)}")
    last_dim_contiguous("q_scale", scale)
    return q.view(torch.uint8), scale, kv_format


def padded_token_row(head_dim: int) -> int:
    """Bytes of a KVBlockSize-1 token row padded to a multiple of 16 (AITER's padded layout:
    ``[num_blocks, 1, 1, 144]`` for D = 128, the token's ``D + 4`` bytes first)."""
    return -(-(head_dim + 4) // 16) * 16


def _cache(kv_cache, kv_block_size: int, row: int, kv_format: str) -> torch.Tensor:
    """The cache as the documented uint8 layout ``[num_blocks, kv_block_size, 1, row]``, every block
    packed (tokens ``row`` bytes apart), block stride and base multiples of 4 (the scale words).
    An fp8 cache is accepted fp8-typed too (AITER's callers hand the cache over as e4m3), and at
    KVBlockSize 1 with each token row padded to :func:`padded_token_row` bytes (the padding is
    never read)."""
    fp8 = kv_format == "fp8"
    kv = tensor("kv_cache", kv_cache, (torch.uint8,) + (FP8_TYPES if fp8 else ()), (4,))
    if kv.dtype != torch.uint8:
        kv = kv.view(torch.uint8)  # one byte per element either way: the same bytes
    widths = (row, padded_token_row(HEAD_DIM)) if fp8 and kv_block_size == 1 else (row,)
    if kv.shape[1] != kv_block_size or kv.shape[2] != 1 or kv.shape[3] not in widths:
        layout = "" if fp8 else " (fp4: D / 2 + 4)"
        shape = f"[num_blocks, KVBlockSize={kv_block_size}, 1, {' or '.join(map(str, widths))}]"
        fail("kv_cache", f"shape {shape}{layout}",
              f"shape {tuple(kv.shape)}")
    kv = kv[..., :row] if kv.shape[3] != row else kv
    packed = kv_block_size * row
    if kv.stride(3) != 1 or (kv_block_size > 1 and kv.stride(1) != row):
        fail("kv_cache", f"every block packed contiguously (strides [*, {row}, *, 1])", f"strides {kv.stride()}")
    if kv.shape[0] > 1 and (kv.stride(0) < packed or kv.stride(0) % 4):
        fail("kv_cache", f"a block stride (stride(0)) that is a multiple of 4 and >= {packed} bytes", kv.stride(0))
    if kv.storage_offset() % 4:
        fail("kv_cache", "a storage offset that is a multiple of 4 bytes (4-byte scale words)", kv.storage_offset())
    return _canonical_size_one_strides(kv, kv_block_size, row)


def _canonical_size_one_strides(kv: torch.Tensor, kv_block_size: int, row: int) -> torch.Tensor:
    """The same cache with the strides of its size-1 dimensions (dim 2; dim 1 at KVBlockSize 1;
    dim 0 with a single block) set to the packed layout's (``row`` bytes a token). Those strides
    address nothing, so validation accepts any value, but backends view the bytes as 4-byte
    scale words, which torch refuses for strides that are not multiples of 4."""
    strides = list(kv.stride())
    if kv.shape[0] <= 1:
        strides[0] = kv_block_size * row
    if kv_block_size == 1:
        strides[1] = row
    strides[2] = row
    if tuple(strides) == kv.stride():
        return kv
    return kv.as_strided(kv.shape, strides, kv.storage_offset())


# ----------------------------------------------------------------------------- aliasing
def byte_span(t: torch.Tensor) -> tuple[int, int] | None:
    """``[first, last + 1)`` byte addresses ``t`` can touch (``None`` for an empty tensor)."""
    if t.numel() == 0:
        return None
    extent = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride())) + 1
    start = t.data_ptr()
    return start, start + extent * t.element_size()


def check_no_overlap(out: torch.Tensor, rows: int, width: int, inputs) -> None:
    """The written region ``out[:rows, :width]`` (last dim contiguous, validated) must not
    overlap itself nor any byte of an input (``inputs``: ``(name, tensor)`` pairs), as PyTorch's
    own ``out=`` rules require; the error names ``out_logits`` and the input."""
    if rows == 0 or width == 0:
        return
    row_stride = out.stride(0)
    if rows > 1 and row_stride < width:
        fail("out_logits", f"rows that do not overlap (stride(0) >= max_model_len={width} over {rows} rows)",
              f"stride(0) {row_stride}")
    size = out.element_size()
    base, row_bytes, step = out.data_ptr(), width * size, row_stride * size
    storage = out.untyped_storage().data_ptr()
    for name, t in inputs:
        if t.untyped_storage().data_ptr() != storage:  # separate allocations share no byte
            continue
        span = byte_span(t)
        if span is None or not _spans_hit_rows(torch.tensor([span[0] - base]), span[1] - span[0], rows, row_bytes, step):
            continue
        # the input's extent meets a written row: look at the bytes it really holds (an input
        # may live in the padding between out's rows without sharing a byte with them)
        starts, length = _contiguous_runs(t)
        if _spans_hit_rows(starts - base, length, rows, row_bytes, step):
            fail("out_logits", f"memory that no input shares (it overlaps `{name}`)", "an aliasing tensor")


def _spans_hit_rows(offsets: torch.Tensor, length: int, rows: int, row_bytes: int, step: int) -> bool:
    """Whether any byte span ``[offset, offset + length)`` (offsets relative to out's first
    byte) meets a written row ``[r * step, r * step + row_bytes)``, ``0 <= r < rows``. A span
    misses every row when it ends before the first, starts after the last, or lies within one
    gap between two rows."""
    ends = offsets + length
    before = ends <= 0
    after = offsets >= (rows - 1) * step + row_bytes
    if rows > 1 and step > row_bytes:
        row = torch.div(offsets, step, rounding_mode="floor")
        in_gap = (offsets - row * step >= row_bytes) & (ends <= (row + 1) * step)
    else:
        in_gap = torch.zeros_like(before)
    return not bool((before | after | in_gap).all())


def _contiguous_runs(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Start addresses (int64, one per run) and byte length of the contiguous runs ``t``'s
    elements occupy: its last-dimension rows when that dimension is contiguous, else each element."""
    size = t.element_size()
    dims = list(zip(t.shape, t.stride()))
    if t.dim() and t.stride(-1) == 1:
        dims, length = dims[:-1], t.shape[-1] * size
    else:
        length = size
    starts = torch.tensor([t.data_ptr()], dtype=torch.int64)
    for count, stride in dims:
        starts = (starts[:, None] + torch.arange(count, dtype=torch.int64)[None, :] * (stride * size)).reshape(-1)
    return starts, length


# ----------------------------------------------------------------------------- block ids
def check_block_ids(context_lens: torch.Tensor, kv_indices: torch.Tensor, next_n: int, kv_block_size: int,
                    max_model_len: int, num_blocks: int) -> None:
    """Every block id a call walks lies in ``[0, num_blocks)``: for sequence ``b`` the entries
    ``kv_indices[b, :ceil(valid_len_b / kv_block_size)]`` with ``valid_len_b = min(L_b,
    max_model_len, max_blocks * kv_block_size)`` and ``L_b`` the sequence length of
    ``problem.py``'s row rules. Reads the tensors (a synchronisation on a device)."""
    batch, max_blocks = kv_indices.shape
    if batch == 0 or max_blocks == 0 or max_model_len == 0:
        return
    lens = context_lens.long().clamp_min(0)
    seq_len = lens.amax(dim=1) if lens.dim() == 2 else lens
    valid_len = seq_len.clamp_max(min(max_model_len, max_blocks * kv_block_size))
    walked = (valid_len + kv_block_size - 1) // kv_block_size  # [B]
    columns = torch.arange(max_blocks, device=kv_indices.device)
    ids = kv_indices.long()
    bad = (columns[None, :] < walked[:, None]) & ((ids < 0) | (ids >= num_blocks))
    if not bool(bad.any()):
        return
    b, column = (int(x) for x in bad.nonzero()[0])
    value = int(ids[b, column])
    where = f"{value} at (b={b}, column={column}), walked for {int(valid_len[b])} positions"
    if num_blocks == 0:
        fail("kv_indices", "ids in [0, num_blocks) but kv_cache has no blocks (num_blocks 0) for a non-zero length", where)
    fail("kv_indices", f"block ids in [0, num_blocks={num_blocks}) for every block a sequence walks", where)


# ----------------------------------------------------------------------------- host options
def check_options(context_hint, clean_logits, backend, config, backend_names) -> None:
    """The keyword options, checked alike on the eager and the ``torch.ops`` paths, once per call
    (the entry point checks them before handing a call to the torch op, the op's implementation
    otherwise; ``build_launch_args`` checks the hint and ``clean_logits`` with the call); ``backend`` must be one of
    ``backend_names`` (the registry's, passed in: validation sits below the backends). A
    ``SymInt`` hint is left to the real implementation, which sees a plain int."""
    if context_hint is not None and not isinstance(context_hint, torch.SymInt):
        host_int("context_hint", context_hint, 0)
    if not isinstance(clean_logits, bool):
        fail("clean_logits", "a bool", repr(clean_logits))
    if backend is not None and (not isinstance(backend, str) or backend not in backend_names):
        fail("backend", "None or one of " + ", ".join(map(repr, backend_names)), repr(backend))
    if config is not None:
        if not isinstance(config, dict):
            fail("config", "a dict of knobs", type(config).__name__)
        if backend is None:
            fail("config", "it only together with `backend`", "a config without a backend")
