"""From measurements to table rows: the pick per context, the context-agnostic pick, provenance,
merging into an existing table and knowing which keys a table already has."""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import math
import os

from paged_mqa_logits import table
from paged_mqa_logits.bench import SKIPPED_FOR_MEMORY
from paged_mqa_logits.files import write_target
from paged_mqa_logits.problem import ShapeKey
from paged_mqa_logits.table import Row, TableWriter

from .candidates import Candidate
from .keys import TuneKey


#: the provenance field that records how the timed batches' lengths were drawn
LENGTHS_FIELD = "lengths="


def provenance(gpu: str, cu_num: int, triton_version: str, torch_version: str, date: str | None = None,
               lengths: str = "") -> str:
    """``tuned:<gpu>|cu<N>|triton<v>|torch<v>|<date>``, then ``|lengths=<mode>`` for batches of
    ragged lengths (a ``bench.shapes.LENGTH_MODES`` mode; uniform batches add nothing), so a
    re-check times the row the way it was tuned (see docs/TUNING.md)."""
    date = date or datetime.date.today().isoformat()
    gpu = gpu.replace(",", " ").replace("|", "/")
    text = f"tuned:{gpu}|cu{cu_num}|triton{triton_version}|torch{torch_version}|{date}"
    return text + (f"|{LENGTHS_FIELD}{lengths}" if lengths else "")


def tuned_lengths(provenance_text: str) -> str:
    """The lengths mode a row's provenance records (``""``: uniform, or not recorded)."""
    fields = provenance_text.split("|")
    return next((f[len(LENGTHS_FIELD):] for f in fields if f.startswith(LENGTHS_FIELD)), "")


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def best_times(candidates: list[Candidate], results: dict) -> dict[int, dict[int, float]]:
    """``{context: {candidate index: us}}`` from ``results[(context, index, stage)] -> Measurement``.

    The confirm stage's time is used where there is one, else the screen's. A candidate that
    failed anything at any context (check, crash, timeout) is dropped everywhere: a context row
    also serves the contexts near it, so it must be right for all of them. A context whose
    inputs did not fit the free memory ran nothing and drops no candidate.
    """
    bad = {idx for (_, idx, _), m in results.items() if not m.ok and not m.status.startswith(SKIPPED_FOR_MEMORY)}
    times: dict[int, dict[int, float]] = {}
    for (context, idx, stage), m in results.items():
        if idx in bad or not m.us:
            continue
        slot = times.setdefault(context, {})
        if stage == "confirm" or idx not in slot:
            slot[idx] = m.us
    return times


def pick(key: TuneKey, candidates: list[Candidate], results: dict,
         allowed=table.KNOWN_BACKENDS) -> tuple[dict[int, tuple[int, float]], tuple[int, float] | None]:
    """``({context: (index, us)}, (index, geomean us) | None)``: the fastest candidate at each
    context, and the candidate with the best geometric mean over all of the key's contexts
    (only candidates timed at every context compete; their geomean is the row's ``us``)."""
    times = best_times(candidates, results)
    per_context = {}
    for context in key.contexts:
        slot = {i: us for i, us in times.get(context, {}).items() if candidates[i].backend in allowed}
        if slot:
            best = min(slot, key=slot.get)
            per_context[context] = (best, slot[best])
    everywhere = [i for i in range(len(candidates)) if candidates[i].backend in allowed
                  and all(i in times.get(c, {}) for c in key.contexts)]
    agnostic = None
    if everywhere:
        means = {i: geomean(times[c][i] for c in key.contexts) for i in everywhere}
        best = min(means, key=means.get)
        agnostic = (best, means[best])
    return per_context, agnostic


def rows_for(key: TuneKey, arch: str, cu_num: int, candidates: list[Candidate], results: dict,
             prov: str, allowed=table.KNOWN_BACKENDS) -> list[Row]:
    """The rows of ``key``'s picks (:func:`pick` among the ``allowed`` backends): one per
    context, one ``any``; a top-k key (its ``shape_key`` a ``TopkKey``) gives top-k rows."""
    per_context, agnostic = pick(key, candidates, results, allowed)
    picks = [(c, i, us) for c, (i, us) in per_context.items()]
    if agnostic:
        picks.append((None, *agnostic))
    return [Row(arch=arch, cu_num=cu_num, shape_key=key.shape_key, context=context, backend=candidates[i].backend, config=candidates[i].config, us=round(us, 3), provenance=prov,
                source="")
            for context, i, us in picks]


def read_existing(path: str) -> list[Row]:
    """Rows of the output file if it exists (a malformed file is an error, never overwritten)."""
    return table.parse_file(path) if os.path.exists(path) else []


def tuned_shape_keys(rows: list[Row], arch: str, cu_num: int,
                     contexts_of: dict[ShapeKey, tuple]) -> set[ShapeKey]:
    """Shape keys that already have a row at every requested context and an ``any`` row for
    this arch and CU count."""
    have: dict[ShapeKey, set] = {}
    for r in rows:
        if r.arch == arch and r.cu_num == cu_num:
            have.setdefault(r.shape_key, set()).add(r.context)
    return {shape_key for shape_key, contexts in contexts_of.items()
            if shape_key in have and set(contexts) | {None} <= have[shape_key]}


def merge(existing: list[Row], new: list[Row], replaced_keys: set[tuple] = frozenset()) -> list[Row]:
    """``existing`` with every row of a re-tuned key (``(arch, cu_num, shape_key)`` in
    ``replaced_keys``) and every row with the same table key as a new row replaced by ``new``."""
    new_keys = {r.key for r in new}

    def stale(r: Row) -> bool:
        return r.key in new_keys or (r.arch, r.cu_num, r.shape_key) in replaced_keys

    return [r for r in existing if not stale(r)] + list(new)


def write_table(path: str, rows: list[Row], comments=()) -> None:
    TableWriter.for_rows(rows).write(path, rows, comments)


@contextlib.contextmanager
def table_lock(path: str):
    """An exclusive advisory lock (``flock``) on ``<table>.lock`` for a read-merge-write of the
    table at ``path`` (its target, for a symbolic link): tuners sharing an output table (several
    GPUs, several hosts on one file system that supports flock) then never lose each other's
    rows. The holder removes the lock file before releasing it, so none is left beside the
    table; a waiter that then gets the lock of a removed file takes the lock again on the
    current one."""
    lock_path = f"{write_target(path)}.lock"
    os.makedirs(os.path.dirname(os.path.abspath(lock_path)), exist_ok=True)
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            current = os.stat(lock_path)
        except FileNotFoundError:
            current = None
        held = os.fstat(fd)
        if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
            break
        os.close(fd)  # the previous holder removed this file: lock the one in its place
    try:
        yield
    finally:
        os.unlink(lock_path)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def kept_notes(path: str, comments) -> list[str]:
    """``comments`` followed by the ``#`` lines of the table at ``path`` that none of them
    replaces: a note that explains hand-picked rows outlives a re-tune of other keys, while a
    line the tuner writes (same text up to its first ``(``) is replaced by its new version."""
    if not os.path.exists(path):
        return list(comments)
    with open(path, encoding="utf-8-sig") as f:
        notes = [line[1:].strip() for line in f if line.startswith("#")]
    stems = {c.split("(")[0] for c in comments}
    return list(comments) + [n for n in notes if n.split("(")[0] not in stems]


def update_table(path: str, rows: list[Row], replaced_keys: set[tuple] = frozenset(), comments=()) -> list[Row]:
    """Under :func:`table_lock`: the table at ``path`` (if any) merged with ``rows`` (see
    :func:`merge`), written atomically with ``comments`` and the table's other notes
    (:func:`kept_notes`). Returns what was written."""
    with table_lock(path):
        merged = merge(read_existing(path), rows, replaced_keys)
        write_table(path, merged, kept_notes(path, comments))
    return merged


def write_key_rows(path: str, rows: list[Row], arch: str, cu_num: int, shape_key, prov: str) -> list[Row]:
    """A tuned key's ``rows`` into the table at ``path`` (:func:`update_table`; the key's earlier
    rows on ``arch``/``cu_num`` replaced) under the tuner's notes for this run's provenance."""
    return update_table(path, rows, {(arch, cu_num, shape_key)},
                        comments=[f"paged_mqa_logits tuned table; rows written by python -m tuner ({prov})",
                                  "schema and lookup rules: paged_mqa_logits/table.py; how to regenerate: "
                                  "docs/TUNING.md"])
