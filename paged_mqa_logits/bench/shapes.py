"""What is benchmarked: :class:`Shape` (one problem, uniform or ragged lengths) and the grids
and shape files that list them."""

from __future__ import annotations

import csv
import itertools
from dataclasses import dataclass

import torch

from ..problem import HEAD_DIM

DEFAULT_GRID = dict(heads=(32, 64), next_n=(1, 2, 3, 4), batch=(1, 8, 32, 64, 128, 256), context=(8192, 32768),
                    kv_block_size=(64,))
#: per-sequence length modes: every sequence at ``context``; drawn from ``[C/2, C]``; from ``[1, C]``
LENGTH_MODES = ("", "half", "wide")


@dataclass(frozen=True)
class Shape:
    """One benchmarked problem: uniform context by default; ``ragged="half"`` draws per-sequence
    lengths from ``[context/2, context]``, ``ragged="wide"`` from ``[1, context]`` (seeded, the
    first one exactly ``context``; ``True`` means ``"half"``)."""

    heads: int
    next_n: int
    batch: int
    context: int
    kv_block_size: int = 64
    preshuffle: bool = False
    head_dim: int = HEAD_DIM
    lens_2d: bool = True
    ragged: str = ""

    def __post_init__(self):
        mode = {True: "half", False: ""}.get(self.ragged, self.ragged)
        if mode not in LENGTH_MODES:
            raise ValueError(f"Shape.ragged must be one of {LENGTH_MODES} (or a bool), got {self.ragged!r}")
        object.__setattr__(self, "ragged", mode)

    def lens(self, seed: int = 0) -> list[int]:
        if not self.ragged:
            return [self.context] * self.batch
        gen = torch.Generator().manual_seed(seed)
        low = self.context // 2 if self.ragged == "half" else 1
        lens = torch.randint(low, self.context + 1, (self.batch,), generator=gen).tolist()
        lens[0] = self.context
        return lens

    def describe(self) -> str:
        return (f"H={self.heads} next_n={self.next_n} batch={self.batch} context={self.context} "
                f"kv_block_size={self.kv_block_size} preshuffle={int(self.preshuffle)}"
                + ("" if self.lens_2d else " lens=1d") + (f" ragged={self.ragged}" if self.ragged else ""))


def grid_shapes(heads, next_n, batch, context, kv_block_size=(64,), preshuffle=(False,), *, lens_2d=True,
                ragged="", head_dim=HEAD_DIM) -> list[Shape]:
    return [Shape(h, n, b, c, bs, p, head_dim, lens_2d, ragged)
            for h, n, bs, p, c, b in itertools.product(heads, next_n, kv_block_size, preshuffle, context, batch)]


def _int_list(text) -> list[int]:
    return [int(x) for x in str(text).replace(";", " ").replace("|", " ").replace(",", " ").split()]


def shapes_from_csv(path: str, *, contexts=None, lens_2d=True, ragged="") -> list[Shape]:
    """Shapes from a CSV with columns ``heads``/``H``, ``next_n``, ``batch`` and ``context`` (or
    ``contexts``, a ``;``-separated list, as in the tuner's untuned files), optionally
    ``kv_block_size``, ``preshuffle``, ``head_dim``. ``contexts`` (a list) overrides the file's."""
    shapes = []
    with open(path, newline="") as f:
        rows = csv.DictReader(line for line in f if line.strip() and not line.lstrip().startswith("#"))
        for row in rows:
            row = {k.strip(): (v or "").strip() for k, v in row.items()}
            ctx = contexts or _int_list(row.get("contexts") or row.get("context") or "")
            if not ctx:
                raise ValueError(f"{path}: row {row} has no context (give --context)")
            for c in ctx:
                shapes.append(Shape(
                    heads=int(row.get("heads") or row["H"]), next_n=int(row["next_n"]), batch=int(row["batch"]),
                    context=c, kv_block_size=int(row.get("kv_block_size") or 64),
                    preshuffle=(row.get("preshuffle") or "0").lower() in ("1", "true"),
                    head_dim=int(row.get("head_dim") or HEAD_DIM), lens_2d=lens_2d, ragged=ragged))
    return shapes
