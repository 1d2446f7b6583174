"""What is benchmarked: :class:`Shape` (one problem, uniform or ragged lengths) and the grids
and shape files that list them."""

from __future__ import annotations

import csv
import itertools
from dataclasses import asdict, dataclass

import torch

from ..problem import HEAD_DIM, ShapeKey
from ..validate import PagedMQAArgumentError, check_problem

#: the cache block size of a shape that names none (grids, shape files, :meth:`Shape.of`)
DEFAULT_KV_BLOCK_SIZE = 64
#: the bench's grid on a GPU (the published comparison): the 64- and 32-token blocks engines use, and a
#: batch of 4096 whose cache (about 18 GB at 32k) lies far past any L2
DEFAULT_GRID = dict(heads=(32, 64), next_n=(1, 2, 3, 4), batch=(1, 8, 32, 64, 128, 256, 4096), context=(8192, 32768),
                    kv_block_size=(32, DEFAULT_KV_BLOCK_SIZE))
#: the grid on a CPU: about a minute on two cores
CPU_GRID = dict(heads=(32, 64), next_n=(1, 2), batch=(1, 8), context=(4096,), kv_block_size=(DEFAULT_KV_BLOCK_SIZE,))
#: per-sequence length modes: every sequence at ``context``; drawn from ``[C/2, C]``; from ``[1, C]``
LENGTH_MODES = ("", "half", "wide")


@dataclass(frozen=True)
class Shape:
    """One benchmarked problem: a shape key at ``context``, uniform by default; ``ragged="half"``
    draws per-sequence lengths from ``[context/2, context]``, ``ragged="wide"`` from
    ``[1, context]`` (seeded, the first one exactly ``context``; ``True`` means ``"half"``).
    ``lens_2d``: ``context_lens`` is ``[B, next_n]`` (else ``[B]``). The key fields live in
    ``shape_key`` only (``shape.shape_key.heads``)."""

    shape_key: ShapeKey
    context: int
    lens_2d: bool = True
    ragged: str = ""

    @classmethod
    def of(cls, heads: int, next_n: int, batch: int, context: int, kv_block_size: int = DEFAULT_KV_BLOCK_SIZE,
           preshuffle: bool = False, head_dim: int = HEAD_DIM, lens_2d: bool = True, ragged="", kv_format: str = "fp8",
           logits_dtype: str = "fp32") -> "Shape":
        """A shape from its numbers (the defaults: the bench's block size, the op's head_dim, fp8
        inputs, fp32 logits)."""
        key = ShapeKey(heads=heads, head_dim=head_dim, kv_block_size=kv_block_size, preshuffle=preshuffle,
                       batch=batch, next_n=next_n, kv_format=kv_format, logits_dtype=logits_dtype)
        return cls(key, context, lens_2d, ragged)

    def __post_init__(self):
        mode = {True: "half", False: ""}.get(self.ragged, self.ragged)
        if mode not in LENGTH_MODES:
            raise ValueError(f"Shape.ragged must be one of {LENGTH_MODES} (or a bool), got {self.ragged!r}")
        object.__setattr__(self, "ragged", mode)

    def lens(self, seed: int = 0) -> list[int]:
        if not self.ragged:
            return [self.context] * self.shape_key.batch
        gen = torch.Generator().manual_seed(seed)
        low = self.context // 2 if self.ragged == "half" else 1
        lens = torch.randint(low, self.context + 1, (self.shape_key.batch,), generator=gen).tolist()
        lens[0] = self.context
        return lens

    def as_dict(self) -> dict:
        """The shape-key fields and the shape's own, in one flat dict."""
        return {**asdict(self.shape_key), "context": self.context, "lens_2d": self.lens_2d, "ragged": self.ragged}

    def describe(self) -> str:
        key = self.shape_key
        return (f"H={key.heads} next_n={key.next_n} batch={key.batch} context={self.context} "
                f"kv_block_size={key.kv_block_size} preshuffle={int(key.preshuffle)}"
                + ("" if self.lens_2d else " lens=1d") + (f" ragged={self.ragged}" if self.ragged else "")
                + key.format_note())


#: shape field -> the bench option that sets it (argument errors name what the user typed)
OPTION_NAMES = {"batch": "--batch", "next_n": "--next-n", "heads": "--heads", "head_dim": "--head-dim",
                "kv_block_size": "--kv-block-size", "context": "--context"}


def shape_error(shape: Shape) -> str | None:
    """The op's own rules on a shape's numbers, before anything is built: the error naming the
    bench option (:data:`OPTION_NAMES`) that set a wrong one, else ``None``."""
    key = shape.shape_key
    try:
        check_problem(arch=None, cu_num=None, batch=key.batch, next_n=key.next_n, heads=key.heads,
                      head_dim=key.head_dim, kv_block_size=key.kv_block_size, preshuffle=key.preshuffle,
                      context=shape.context, names=OPTION_NAMES)
    except PagedMQAArgumentError as exc:
        return str(exc)
    return None


def grid_shapes(heads, next_n, batch, context, kv_block_size=(DEFAULT_KV_BLOCK_SIZE,), preshuffle=(False,), *,
                lens_2d=True, ragged="", head_dim=HEAD_DIM, kv_format="fp8", logits_dtype="fp32") -> list[Shape]:
    return [Shape.of(h, n, b, c, kv_block_size, p, head_dim, lens_2d, ragged, kv_format, logits_dtype)
            for h, n, kv_block_size, p, c, b in itertools.product(heads, next_n, kv_block_size, preshuffle, context, batch)]


def int_list(text) -> list[int]:
    """The ints of a list written with commas, spaces, ``;`` or ``|`` (CSV cells, CLI arguments)."""
    return [int(x) for x in str(text).replace(";", " ").replace("|", " ").replace(",", " ").split()]


def shapes_from_csv(path: str, *, contexts=None, lens_2d=True, ragged="", kv_format=None,
                    logits_dtype=None) -> list[Shape]:
    """Shapes from a CSV with columns ``heads``/``H``, ``next_n``, ``batch`` and ``context`` (or
    ``contexts``, a ``;``-separated list, as in the tuner's untuned files), optionally
    ``kv_block_size``, ``preshuffle``, ``head_dim``, ``kv_format``, ``logits_dtype``.
    ``contexts`` (a list), ``kv_format`` and ``logits_dtype`` override the file's."""
    shapes = []
    with open(path, newline="") as f:
        rows = csv.DictReader(line for line in f if line.strip() and not line.lstrip().startswith("#"))
        for row in rows:
            row = {k.strip(): (v or "").strip() for k, v in row.items()}
            ctx = contexts or int_list(row.get("contexts") or row.get("context") or "")
            if not ctx:
                raise ValueError(f"{path}: row {row} has no context (give --context)")
            cells = {"heads": row.get("heads") or row.get("H"), "head_dim": row.get("head_dim") or str(HEAD_DIM),
                     "kv_block_size": row.get("kv_block_size") or str(DEFAULT_KV_BLOCK_SIZE),
                     "preshuffle": row.get("preshuffle") or "0", "batch": row.get("batch"), "next_n": row.get("next_n"),
                     "kv_format": kv_format or row.get("kv_format"),
                     "logits_dtype": logits_dtype or row.get("logits_dtype")}
            try:
                key = ShapeKey.parse(cells)
            except ValueError as exc:
                raise ValueError(f"{path}: row {row}: {exc}") from None
            shapes.extend(Shape(key, c, lens_2d, ragged) for c in ctx)
    return shapes
