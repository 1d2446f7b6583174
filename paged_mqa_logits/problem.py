"""The host-side problem key and the normalised arguments every backend receives.

* :class:`ShapeKey` -- what a call *is*, as tuned rows and compiled kernels tell calls apart
  (heads, head_dim, kv_block_size, preshuffle, batch, next_n, the key format and the logits
  dtype). The other keys (table rows,
  untuned keys, benchmarked shapes, problems) are composed from it: docs/ARCHITECTURE.md.
* :class:`Target` -- where a problem is judged: the chip (arch, CU count), the tensors' device
  type, and whether the call is only described (``hypothetical``). Dispatch asks backends
  whether this machine can launch for it; backends never see it in a problem.
* :class:`Problem` -- one call: its shape key, its chip (arch, CU count), and the rest of what
  dispatch and the backends read (context hint, lengths layout, fp8 flavour, max_model_len,
  cache layout).

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

from collections.abc import Mapping
from dataclasses import MISSING, asdict, astuple, dataclass, fields, replace
from typing import ClassVar

import torch

from .arch import native_fp8

HEAD_DIM = 128
SUPPORTED_KV_BLOCK_SIZES = (1, 16, 32, 64, 128, 256)
MAX_NEXT_N = 8

#: formats of the queries and keys: fp8 e4m3 with a per-token fp32 key scale, or MXFP4 (e2m1
#: pairs packed in bytes, one ue8m0 exponent per 32 elements, for the query and every key)
KV_FORMATS = ("fp8", "fp4")
#: the logits dtypes, by the name keys and tables spell them
LOGITS_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: elements one ue8m0 exponent of the fp4 format scales
FP4_GROUP = 32
#: bytes of the per-token word after the keys: an fp32 scale (fp8) or four ue8m0 exponents (fp4)
SCALE_BYTES = 4


def key_bytes(head_dim: int, kv_format: str) -> int:
    """Bytes of one token's key in the cache (and of one query head): a byte per element in fp8,
    two elements per byte in fp4."""
    return head_dim if kv_format == "fp8" else head_dim // 2


def token_bytes(head_dim: int, kv_format: str) -> int:
    """Bytes of one token in a cache block: its key and its scale word."""
    return key_bytes(head_dim, kv_format) + SCALE_BYTES


def logits_dtype_name(dtype: torch.dtype) -> str:
    """``"fp32"``/``"bf16"`` for a logits dtype (``ValueError`` for any other)."""
    for name, value in LOGITS_DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"not a logits dtype: {dtype}")


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


def int_cell(cells: Mapping[str, str | None], column: str, minimum: int = 1) -> int:
    """The integer in CSV cell ``column`` (``ValueError`` naming the column when it is not one,
    or is below ``minimum``)."""
    text = (cells.get(column) or "").strip()
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"column {column} must be an integer, got {text!r}") from None
    if value < minimum:
        raise ValueError(f"column {column} must be >= {minimum}, got {value}")
    return value


def choice_cell(cells: Mapping[str, str | None], column: str, choices, default: str) -> str:
    """The text in CSV cell ``column``, one of ``choices``; ``default`` when the column is absent
    or the cell empty (tables written before the column existed)."""
    text = (cells.get(column) or "").strip() or default
    if text not in choices:
        raise ValueError(f"column {column} must be one of {', '.join(choices)}, got {text!r}")
    return text


def bool_cell(cells: Mapping[str, str | None], column: str) -> bool:
    """The flag in CSV cell ``column``: ``0``/``1`` (``false``/``true`` also read)."""
    text = (cells.get(column) or "").strip()
    if text.lower() not in ("0", "1", "true", "false"):
        raise ValueError(f"column {column} must be 0 or 1, got {text!r}")
    return text.lower() in ("1", "true")


@dataclass(frozen=True, kw_only=True)
class ShapeKey:
    """What a call *is*, as far as tuned rows and compiled kernels tell calls apart.

    The fields are the tables' key columns, in their order (:data:`SHAPE_KEY_COLUMNS`); where the
    call runs (:class:`Target`) and its context are not part of it. The op's rules on the values
    (heads a multiple of 16, ...) are ``validate.py``'s; a key only holds them.
    """

    heads: int  # H, query heads
    head_dim: int  # D, elements of a key (HEAD_DIM)
    kv_block_size: int  # tokens per cache block (the op's KVBlockSize)
    preshuffle: bool  # key bytes stored in 16x16 tiles (the op's Preshuffle)
    batch: int  # B, sequences
    next_n: int  # query rows per sequence
    #: the query/key format (:data:`KV_FORMATS`) and the logits dtype (:data:`LOGITS_DTYPES`);
    #: optional columns of a table, the defaults being what tables without them were tuned for
    kv_format: str = "fp8"
    logits_dtype: str = "fp32"
    #: the op whose rows this key selects (a table's ``op`` column; :class:`TopkKey` for ``topk``)
    op: ClassVar[str] = "mqa_logits"

    @property
    def family(self) -> tuple:
        """Keys of one family share compiled kernels: they differ only in batch."""
        return (self.heads, self.head_dim, self.kv_block_size, self.preshuffle, self.next_n, self.kv_format,
                self.logits_dtype)

    def values(self) -> tuple:
        """The fields in column order."""
        return astuple(self)

    def cells(self) -> dict:
        """Column -> CSV cell value (``preshuffle`` as 0/1), as :meth:`parse` reads it back."""
        return {**asdict(self), "preshuffle": int(self.preshuffle)}

    @classmethod
    def parse(cls, cells: Mapping[str, str | None]) -> "ShapeKey":
        """The key in CSV cells (column -> text): positive integers, ``preshuffle`` 0 or 1,
        ``kv_format`` and ``logits_dtype`` one of their names (absent or empty: the default).
        ``ValueError`` names the column of a missing or malformed cell."""
        values = {c: bool_cell(cells, c) if c == "preshuffle" else int_cell(cells, c) for c in REQUIRED_KEY_COLUMNS}
        values["kv_format"] = choice_cell(cells, "kv_format", KV_FORMATS, "fp8")
        values["logits_dtype"] = choice_cell(cells, "logits_dtype", tuple(LOGITS_DTYPES), "fp32")
        return cls(**values)

    def describe(self) -> str:
        return (f"H={self.heads} D={self.head_dim} kv_block_size={self.kv_block_size} "
                f"preshuffle={int(self.preshuffle)} batch={self.batch} next_n={self.next_n}" + self.format_note())

    def describe_family(self) -> str:
        """The key without its batch, as :meth:`describe` spells the rest."""
        return (f"H={self.heads} D={self.head_dim} kv_block_size={self.kv_block_size} "
                f"preshuffle={int(self.preshuffle)} next_n={self.next_n}" + self.format_note())

    def format_note(self) -> str:
        """`` kv_format=.. logits_dtype=..`` where they are not the defaults, else empty."""
        return "".join(f" {name}={getattr(self, name)}" for name, default in OPTIONAL_KEY_COLUMNS.items()
                       if getattr(self, name) != default)


#: the :class:`ShapeKey` fields, in table-column order
SHAPE_KEY_COLUMNS = tuple(f.name for f in fields(ShapeKey))
#: the key columns a table may leave out, with the value their absence stands for
OPTIONAL_KEY_COLUMNS = {f.name: f.default for f in fields(ShapeKey) if f.default is not MISSING}
#: the key columns every table has
REQUIRED_KEY_COLUMNS = tuple(c for c in SHAPE_KEY_COLUMNS if c not in OPTIONAL_KEY_COLUMNS)


@dataclass(frozen=True, kw_only=True)
class TopkKey:
    """What a top-k call (``paged_mqa_logits.topk``) *is* to its tuned rows: the rows selected
    from (``batch * next_n``), the ``k`` selected and the logits dtype. The row width (the
    context) is a table row's ``context``, as for the logits op. Columns ``rows``, ``k`` and the
    shared ``logits_dtype`` (absent or empty: ``fp32``) of rows whose ``op`` is ``topk``."""

    rows: int
    k: int
    logits_dtype: str = "fp32"
    op: ClassVar[str] = "topk"

    @property
    def family(self) -> tuple:
        """Rows of one family are chosen among by nearest ``k``, then rows, then context."""
        return ("topk", self.logits_dtype)

    def cells(self) -> dict:
        return asdict(self)

    @classmethod
    def parse(cls, cells: Mapping[str, str | None]) -> "TopkKey":
        """The key in CSV cells; ``ValueError`` names the column of a missing or malformed cell."""
        return cls(rows=int_cell(cells, "rows"), k=int_cell(cells, "k"),
                   logits_dtype=choice_cell(cells, "logits_dtype", tuple(LOGITS_DTYPES), "fp32"))

    def describe(self) -> str:
        return f"topk rows={self.rows} k={self.k}" + (f" logits_dtype={self.logits_dtype}"
                                                      if self.logits_dtype != "fp32" else "")


#: the :class:`TopkKey` columns of a table that no logits row has (``logits_dtype`` is shared)
TOPK_KEY_COLUMNS = ("rows", "k")


@dataclass(frozen=True)
class Target:
    """Where a problem is judged: the chip, the tensors' device type, and whether the call is
    only described (``explain``, ``compile --only-table``, the tuner's dry run, table checks).

    A :class:`Problem` keeps the chip (``arch``, ``cu_num``); the rest is tooling's and the
    dispatcher's: a backend's ``unsupported(problem)`` judges the call, its
    ``unavailable(target)`` whether this machine can launch its kernels there, asked only for a
    target that is not ``hypothetical`` (``backends.registry.why_not``)."""

    arch: str  # "sm_90", "gfx942", "gfx950", "cpu", ...
    cu_num: int  # CUs (ROCm) or SMs (CUDA); 0 on CPU
    device_type: str  # torch device type: "cpu" | "cuda" (ROCm reports "cuda" too)
    hypothetical: bool = False

    @classmethod
    def present(cls, arch: str, cu_num: int) -> "Target":
        """A chip in this process, the tensors on it: ``cpu`` tensors for the ``cpu`` arch (what
        CPU tensors always run as, ``arch.detect``), GPU tensors for any other."""
        return cls(arch, cu_num, "cpu" if arch == "cpu" else "cuda")

    @classmethod
    def described(cls, arch: str, cu_num: int) -> "Target":
        """A chip described rather than present: its tensors would live on it (``cpu`` for CPU)."""
        return replace(cls.present(arch, cu_num), hypothetical=True)


@dataclass(frozen=True)
class Problem:
    """One call, as the backends judge it: what it is (its :attr:`shape_key`, fp8 flavour, cache
    layout, ...) and the chip it runs on. Hashable: with its :class:`Target` it is the
    dispatch-cache key.

    The key fields live in :attr:`shape_key` only (``problem.shape_key.heads``). Of a
    :class:`Target` a problem keeps the chip (``arch``, ``cu_num``), not the whole target: where
    the tensors live and whether the call is only described are the target's, and backends judge
    a problem the same wherever it would run. :meth:`of` builds a problem from a key and a
    target. ``context`` is the caller's host-side hint (longest context in the batch) or ``None``.
    """

    arch: str  # Target.arch
    cu_num: int  # Target.cu_num
    shape_key: ShapeKey
    context: int | None
    lens_2d: bool  # context_lens is [B, next_n] (else [B])
    fp8: str  # "fn" | "fnuz" (fp8_flavour of q)
    max_model_len: int
    #: cache layout, as far as kernels compile differently for it: the block stride in bytes
    #: (``kv_cache.stride(0)``; 0 = packed, ``kv_block_size * token_bytes``), whether the
    #: cache's first byte is 16-byte aligned, and whether every cache byte lies within 2^31 of
    #: it (32-bit offsets; see :func:`kv_fits_32bit`). Described problems assume a packed,
    #: aligned cache under 2 GiB.
    kv_block_stride: int = 0
    kv_base_aligned: bool = True
    kv_32bit: bool = True

    @classmethod
    def of(cls, shape_key: ShapeKey, target: Target, *, max_model_len: int, context: int | None = None,
           lens_2d: bool = True, fp8: str | None = None, kv_block_stride: int = 0, kv_base_aligned: bool = True,
           kv_32bit: bool = True) -> "Problem":
        """The problem of a call with ``shape_key`` on ``target``'s chip (``fp8``: the arch's
        native flavour unless given; the cache layout: packed, aligned, under 2 GiB unless
        given). The target's device type and ``hypothetical`` stay with the target."""
        return cls(
            arch=target.arch, cu_num=target.cu_num, shape_key=shape_key, context=context, lens_2d=lens_2d,
            fp8=fp8 or native_fp8(target.arch), max_model_len=max_model_len, kv_block_stride=kv_block_stride,
            kv_base_aligned=kv_base_aligned, kv_32bit=kv_32bit,
        )

    @classmethod
    def from_record(cls, fields: Mapping) -> "Problem":
        """The problem a stored record holds (``dataclasses.asdict`` of one, as AOT manifests
        keep it: the key nested under ``shape_key``). Records written while problems held the key
        fields flat load too (``kv_format``/``logits_dtype`` absent: the key's defaults), and so do
        those written while problems also carried their target's :data:`TARGET_ONLY_FIELDS`
        (ignored)."""
        rest = {name: value for name, value in fields.items()
                if name not in TARGET_ONLY_FIELDS and name not in SHAPE_KEY_COLUMNS}
        key = rest.pop("shape_key", None)
        if key is None:
            key = {name: fields[name] for name in SHAPE_KEY_COLUMNS if name in fields}
        return cls(shape_key=key if isinstance(key, ShapeKey) else ShapeKey(**key), **rest)

    @property
    def token_bytes(self) -> int:
        """Bytes of one token in a cache block (:func:`token_bytes`)."""
        return token_bytes(self.shape_key.head_dim, self.shape_key.kv_format)

    @property
    def kv_stride_bytes(self) -> int:
        return self.kv_block_stride or self.shape_key.kv_block_size * self.token_bytes

    @property
    def kv_aligned16(self) -> bool:
        """Every block starts 16-byte aligned: base and block stride are 16-byte multiples."""
        return self.kv_base_aligned and self.kv_stride_bytes % 16 == 0

    @property
    def rows(self) -> int:
        return self.shape_key.batch * self.shape_key.next_n

    @property
    def work_context(self) -> int:
        """Context used to size host-side decisions: the hint, else the output width."""
        return self.context if self.context is not None else self.max_model_len

    def describe(self) -> str:
        ctx = "any" if self.context is None else str(self.context)
        key = self.shape_key
        return (
            f"arch={self.arch} cu_num={self.cu_num} batch={key.batch} next_n={key.next_n} "
            f"heads={key.heads} head_dim={key.head_dim} kv_block_size={key.kv_block_size} "
            f"preshuffle={int(key.preshuffle)} context={ctx}" + key.format_note()
        )


def resolve_target(problem: Problem, target: Target | None) -> Target:
    """``target``; ``None`` stands for the problem's own chip with the tensors on it
    (:meth:`Target.present`), the target of a call validated in this process."""
    return target if target is not None else Target.present(problem.arch, problem.cu_num)


#: :class:`Target` fields a problem does not hold (older AOT records of problems have them)
TARGET_ONLY_FIELDS = ("device_type", "hypothetical")


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
    cache. ``kv_cache`` is ``[num_blocks, kv_block_size, 1, token_bytes]`` uint8 (``head_dim + 4``
    for fp8, ``head_dim / 2 + 4`` for fp4) whose block stride ``kv_cache.stride(0)`` (bytes) may
    exceed ``kv_block_size * token_bytes``. With fp4, ``q`` holds the packed query bytes and
    ``q_scale`` its exponents; ``out`` is fp32 or bf16 (``problem.shape_key.logits_dtype``).
    ``clean_logits``: the caller wants ``-inf`` in ``[valid_end, max_model_len)`` of every row,
    decided when the call is validated; the chosen kernel writes it where its backend's
    ``writes_tails`` says so, else the op's tail kernel (``backends.base.kernel_writes_tails``).
    """

    q: torch.Tensor  # [B, next_n, H, D] fp8, or [B, next_n, H, D / 2] uint8 packed fp4
    kv_cache: torch.Tensor  # [num_blocks, kv_block_size, 1, token_bytes] uint8
    weights: torch.Tensor  # [B * next_n, H] fp32
    out: torch.Tensor  # [>= B * next_n, >= max_model_len] fp32 or bf16
    context_lens: torch.Tensor  # [B] or [B, next_n] int32
    block_table: torch.Tensor  # [B, max_blocks] int32
    max_model_len: int
    problem: Problem  # the call's one home of kv_block_size, preshuffle and the other key fields
    clean_logits: bool = False
    q_scale: torch.Tensor | None = None  # fp4: [B, next_n, H] int32, four ue8m0 exponents per head

    @property
    def target(self) -> Target:
        """Where this call runs: the problem's chip and the device type of the tensors."""
        return Target(self.problem.arch, self.problem.cu_num, self.q.device.type)

    @property
    def max_blocks(self) -> int:
        return self.block_table.shape[1]

    @property
    def num_blocks(self) -> int:
        return self.kv_cache.shape[0]

    @property
    def visible_width(self) -> int:
        """Columns any row can see: ``min(max_model_len, max_blocks * kv_block_size)``."""
        return min(self.max_model_len, self.max_blocks * self.problem.shape_key.kv_block_size)
