"""Untuned key lists: what the tuner is asked to tune.

An untuned CSV has one problem key per line (``#`` lines are comments)::

    heads,head_dim,kv_block_size,preshuffle,batch,next_n,kv_format,logits_dtype,contexts
    32,128,64,1,64,2,fp4,bf16,8192;32768;131072

``contexts`` is optional (``;``-separated); the command line's ``--contexts`` overrides it.
``kv_format`` and ``logits_dtype`` are optional too (``fp8``/``fp32`` where absent or empty): a
key tunes the kernels of its format and logits dtype. The arch and CU count are not in the
file: they are the current device's.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from paged_mqa_logits.bench import Shape
from paged_mqa_logits.files import atomic_write, read_text
from paged_mqa_logits.problem import REQUIRED_KEY_COLUMNS, SHAPE_KEY_COLUMNS, ShapeKey

DEFAULT_CONTEXTS = (8192, 32768)
COLUMNS = SHAPE_KEY_COLUMNS + ("contexts",)


@dataclass(frozen=True)
class TuneKey:
    """A shape key to tune, at the contexts to time it at (its rows: one per context and one
    ``any`` row across them). The key fields live in ``shape_key`` only (``key.shape_key.heads``)."""

    shape_key: ShapeKey
    contexts: tuple[int, ...]

    @property
    def family(self) -> tuple:
        return self.shape_key.family

    def shape(self, context: int, lengths: str = "") -> Shape:
        """The benchmark shape at ``context``: every sequence at it (``lengths=""``), or drawn from
        ``[1, context]`` (``"wide"``) or ``[context/2, context]`` (``"half"``), see :class:`Shape`."""
        return Shape(self.shape_key, context, ragged=lengths)

    def describe(self) -> str:
        return self.shape_key.describe()


def parse_contexts(text: str) -> tuple[int, ...]:
    values = [int(x) for x in text.replace(",", " ").replace(";", " ").replace("|", " ").split()]
    if any(v < 1 for v in values):
        raise ValueError(f"contexts must be positive, got {text!r}")
    return tuple(sorted(set(values)))


def read_untuned(paths: list[str], contexts: tuple[int, ...] | None = None) -> list[TuneKey]:
    """Keys of the untuned files, de-duplicated (a key listed twice gets the union of its contexts)."""
    merged: dict[ShapeKey, set[int]] = {}
    for path in paths:
        text = read_text(path)
        lines = [(n, line) for n, line in enumerate(io.StringIO(text, newline=""), start=1)
                 if line.strip() and not line.lstrip().startswith("#")]
        if not lines:
            continue
        header = [c.strip() for c in next(csv.reader([lines[0][1]]))]
        missing = [c for c in REQUIRED_KEY_COLUMNS if c not in header]
        if missing:
            raise ValueError(f"{path}:{lines[0][0]}: header lacks column(s) {', '.join(missing)}")
        for lineno, line in lines[1:]:
            cells = dict(zip(header, (c.strip() for c in next(csv.reader([line])))))
            try:
                shape_key = ShapeKey.parse(cells)
                ctx = contexts or parse_contexts(cells.get("contexts") or "") or DEFAULT_CONTEXTS
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
            merged.setdefault(shape_key, set()).update(ctx)
    return [TuneKey(shape_key, tuple(sorted(ctx))) for shape_key, ctx in merged.items()]


def coarse_to_fine(values) -> dict[int, int]:
    """Rank values so that any prefix covers the range evenly: the ends first, then midpoints
    (1, 256, 16, 4, 64, 2, 8, 32, 128 for powers of two up to 256). A run stopped by its time
    budget then leaves tuned batches spread over the range, and the nearest-batch rule serves
    the others."""
    ordered = sorted(set(values))
    rank: dict[int, int] = {}
    if not ordered:
        return rank
    rank[ordered[0]] = 0
    rank.setdefault(ordered[-1], 1)
    spans = [(0, len(ordered) - 1)]
    while spans:
        nxt = []
        for lo, hi in spans:
            if hi - lo < 2:
                continue
            mid = (lo + hi) // 2
            rank.setdefault(ordered[mid], len(rank))
            nxt += [(lo, mid), (mid, hi)]
        spans = nxt
    return rank


def order_keys(keys: list[TuneKey]) -> list[TuneKey]:
    """Coarse-to-fine in batch first, then by family: an early stop loses detail, not coverage."""
    rank = coarse_to_fine(k.shape_key.batch for k in keys)
    return sorted(keys, key=lambda k: (rank[k.shape_key.batch], k.family))


def write_untuned(path: str, keys: list[TuneKey], comments=()) -> None:
    with atomic_write(path, newline="") as f:
        for line in comments:
            f.write(f"# {line}\n")
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS)
        for k in keys:
            w.writerow(list(k.shape_key.cells().values()) + [";".join(map(str, k.contexts))])
