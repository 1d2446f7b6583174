"""The balanced work schedule every GPU kernel follows, as a plain Python model.

A decode batch's contexts spread widely (a few hundred tokens next to the model's maximum).
Splitting every sequence into the same number of programs, sized by the longest one, leaves
the programs of short sequences idle while the long ones set the time. The balanced schedule
instead gives each of a fixed number of *persistent* programs an equal share of the batch's
total work, counted from the actual lengths on the device:

* a **work item** is one tile of ``chunk`` key positions of one sequence, scored against all
  the query rows the program covers. Sequence ``b`` has
  ``tiles(b) = ceil(visible_end(b) / chunk)`` items, where ``visible_end`` is the sequence's
  length (``L_b``, or ``max_j lens[b, j]`` for 2-D lengths) clipped to ``max_model_len`` and to
  the block table's width; zero-length sequences have none;
* items are numbered sequence-major: item ``i`` is tile ``i - prefix(b)`` of the sequence ``b``
  with ``prefix(b) <= i < prefix(b) + tiles(b)`` (``prefix`` = exclusive prefix sum);
* program ``p`` of ``P`` takes items ``[total * p // P, total * (p + 1) // P)``: the shares
  differ by at most one item, whatever the lengths. A share may end inside one sequence and
  the next program's share begin there (each logit is independent: no combine step), and one
  share may cover the tail of a sequence and the head of the next ones;
* a program walks its share as *segments*: maximal runs of its items inside one sequence. It
  loads a sequence's query rows and weights once per segment.

Each kernel computes the prefix sum itself, from the lengths on the device (every program reads
all ``B`` lengths: a few KiB from L2), so the schedule follows lengths changed in place under
CUDA/HIP graph replay, needs no host synchronisation and no extra call. ``P`` is a host value:
the machine's SM/CU count times the programs one SM/CU holds at once.

The per-sequence split (``Schedule=split``) remains a knob value: program ``(b, s)`` of
``num_splits`` per sequence takes an even share of sequence ``b``'s tiles. It wins where the
batch is one or two sequences and the extra length-scan latency of the balanced schedule shows.

This module is the reference the device code is tested against (``tests/test_schedule.py``);
nothing on the hot path imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

#: values of the ``Schedule`` knob
BALANCED = "balanced"
SPLIT = "split"
SCHEDULES = (BALANCED, SPLIT)
#: on sm_90 the Gluon kernels' default schedule is ``balanced`` from this batch on. Measured on the H200
#: (sm_90 wgmma, same run, benchmarks/h200/): on batches whose contexts are uniform in [1, C],
#: balanced is 1.0-1.9x faster than split from batch 32 on; at batch 1-8 the length scan and
#: the dependent loads before the first key copy cost it 1-2.5 us, and split wins.
BALANCED_MIN_BATCH = 32


@dataclass(frozen=True)
class Segment:
    """Tiles ``[first_tile, stop_tile)`` of sequence ``seq``, one program's run inside it."""

    seq: int
    first_tile: int
    stop_tile: int


def tile_counts(visible_ends: Sequence[int], chunk: int) -> list[int]:
    """Work items per sequence: ``ceil(max(end, 0) / chunk)``."""
    return [-(-max(int(end), 0) // chunk) for end in visible_ends]


def share(total: int, program: int, num_programs: int) -> tuple[int, int]:
    """Items ``[start, stop)`` of ``program``: ``total * p // P`` (computed in 64 bits on the
    device: ``total * p`` passes 2^31 for long batches on large chips)."""
    return total * program // num_programs, total * (program + 1) // num_programs


def locate(counts: Sequence[int], item: int) -> tuple[int, int]:
    """``(sequence, tile)`` of global ``item``: the first sequence whose inclusive prefix sum
    exceeds ``item``. Device form: ``seq = #{b : cum_incl(b) <= item}`` and
    ``tile = item - max{cum_incl(b) : cum_incl(b) <= item}`` (0 when no such ``b``)."""
    prefix = 0
    for seq, count in enumerate(counts):
        if item < prefix + count:
            return seq, item - prefix
        prefix += count
    raise IndexError(f"item {item} is past the batch's {prefix} items")


def program_segments(counts: Sequence[int], program: int, num_programs: int) -> list[Segment]:
    """The segments program ``program`` of ``num_programs`` walks, in order."""
    start, stop = share(sum(counts), program, num_programs)
    if start >= stop:
        return []
    seq, tile = locate(counts, start)
    out, remaining = [], stop - start
    while remaining > 0:
        while counts[seq] == 0:  # zero-length sequences between long ones hold no items
            seq += 1
        take = min(counts[seq] - tile, remaining)
        out.append(Segment(seq, tile, tile + take))
        remaining -= take
        seq, tile = seq + 1, 0
    return out


def split_segments(counts: Sequence[int], seq: int, split: int, num_splits: int) -> list[Segment]:
    """``Schedule=split``: the tiles of program ``(seq, split)``: an even share of the
    sequence's tiles (empty when the sequence is shorter than the split count assumed)."""
    n = counts[seq]
    first, stop = n * split // num_splits, n * (split + 1) // num_splits
    return [Segment(seq, first, stop)] if first < stop else []


def persistent_programs(cu_num: int, programs_per_cu: int) -> int:
    """Grid size of the balanced schedule: one wave of resident programs."""
    return max(1, int(cu_num)) * max(1, int(programs_per_cu))


def derive_split_kv(cu_num: int, batch: int, context: int, chunk_k: int, ctas_per_cu: int = 2) -> int:
    """``Schedule=split`` with ``SplitKV = 0``: enough (sequence, split) programs to fill
    ``ctas_per_cu`` waves of the chip, never more splits than a sequence of ``context`` tokens
    has tiles. Programs whose share is empty exit at once, so over-estimating the context
    costs a few idle programs, not wrong results."""
    chunks = max(1, math.ceil(max(context, 1) / chunk_k))
    want = max(1, math.ceil(max(cu_num, 1) * ctas_per_cu / max(batch, 1)))
    return max(1, min(want, chunks))
