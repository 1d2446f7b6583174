"""Re-check a tuned table on this GPU: the check a fleet's CI runs after a driver, compiler or
package update.

Every row of the table for this arch (and CU count) is re-timed through the *production
dispatch* (the op's own path, with the table as the only table file), in worker processes, with
the bench method. A context row is timed at its context with that context as the host hint; an
``any`` row is timed without a hint at each context the table has for its key, and compared by
geometric mean, as the tuner computed it. Reported per row:

* **drift**: measured vs the table's recorded ``us``, flagged beyond +-10% (``--drift``);
* **regression** against a baseline CSV (an older table, or the ``--out`` of an earlier
  re-check): ``WARN`` from 1.10x slower, ``FAIL`` from 1.15x; with ``--fail-on-regression`` a
  FAIL makes the exit status 1;
* the backend the dispatch actually ran, and the accuracy check (a failing check is always an
  error).

Each row is timed the way it was tuned: with the per-sequence lengths its provenance records
(``|lengths=wide``: uniform in ``[1, context]``; nothing: every sequence at the context), unless
``lengths`` names one mode for every row. A baseline must cover at least one of the rows
checked (a header-only or foreign file judges nothing): otherwise the re-check fails before
timing anything.
"""

from __future__ import annotations

import csv
import os
import sys
from dataclasses import dataclass, field

from paged_mqa_logits import bench, table
from paged_mqa_logits.files import atomic_write
from paged_mqa_logits.problem import ShapeKey
from paged_mqa_logits.table import Row

from .keys import DEFAULT_CONTEXTS, TuneKey
from .worker import Pool, Task
from .writer import geomean, tuned_lengths

DRIFT, WARN, FAIL = 0.10, 1.10, 1.15


def classify(measured: float | None, recorded: float | None, baseline: float | None, *, drift: float = DRIFT,
             warn: float = WARN, fail: float = FAIL) -> tuple[str, str]:
    """``(drift note, regression verdict)`` for one row. The drift note is empty within
    ``+-drift`` of the recorded time; the verdict is ``""`` without a baseline, else ``ok``,
    ``WARN x.xx`` (>= ``warn`` times the baseline) or ``FAIL x.xx`` (>= ``fail``)."""
    note = ""
    if measured is None:
        return "not measured", ""
    if recorded is None:
        note = "no recorded us"
    else:
        ratio = measured / recorded
        if ratio > 1 + drift:
            note = f"DRIFT slower {ratio:.2f}x"
        elif ratio < 1 - drift:
            note = f"DRIFT faster {ratio:.2f}x"
    if baseline is None:
        return note, ""
    ratio = measured / baseline
    verdict = f"FAIL {ratio:.2f}x" if ratio >= fail else f"WARN {ratio:.2f}x" if ratio >= warn else "ok"
    return note, verdict


@dataclass
class Point:
    row: Row
    contexts: tuple[int, ...]
    times: dict = field(default_factory=dict)  # context -> Measurement

    @property
    def measured(self) -> float | None:
        us = [m.us for m in self.times.values() if m.ok and m.us]
        if len(us) != len(self.contexts):
            return None
        return us[0] if self.row.context is not None else geomean(us)

    @property
    def status(self) -> str:
        bad = [m.status for m in self.times.values() if not m.ok]
        return bad[0] if bad else "ok" if len(self.times) == len(self.contexts) else "not measured"

    @property
    def ran(self) -> str:
        seen = {f"{m.backend}[{bench.format_knobs(m.knobs)}]" for m in self.times.values() if m.backend}
        return " / ".join(sorted(seen))


def points_for(rows: list[Row], arch: str, cu_num: int) -> tuple[list[Point], str]:
    """The rows to re-time on this device: its arch, its CU count (or the nearest tuned one);
    rows of the logits op only (a top-k row is re-tuned with ``--op topk --all``)."""
    mine = [r for r in rows if r.arch == arch and r.op == "mqa_logits"]
    if not mine:
        return [], f"the table has no rows for {arch}"
    cus = {r.cu_num for r in mine}
    cu = cu_num if cu_num in cus else min(cus, key=lambda c: (abs(c - cu_num), -c))
    note = "" if cu == cu_num else f"no rows for cu_num {cu_num}; re-timing the rows of cu_num {cu}"
    mine = [r for r in mine if r.cu_num == cu]
    contexts_of: dict[ShapeKey, set] = {}
    for r in mine:
        if r.context is not None:
            contexts_of.setdefault(r.shape_key, set()).add(r.context)
    points = [Point(r, (r.context,) if r.context is not None
                    else tuple(sorted(contexts_of.get(r.shape_key, DEFAULT_CONTEXTS)))) for r in mine]
    return points, note


def read_baseline(path: str) -> dict[tuple, float]:
    """``{table key: us}`` from a tuned table or a re-check report (its ``measured_us`` column);
    a torn or malformed report raises ``ValueError`` naming the file and line."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        lines = [line for line in f if line.strip() and not line.lstrip().startswith("#")]
    header = next(csv.reader(lines[:1]), [])
    if "measured_us" not in header:
        return {r.key: r.us for r in table.parse_file(path) if r.us}
    out = {}
    for number, d in enumerate(csv.DictReader(lines), start=2):
        try:
            if None in d or None in d.values():
                raise ValueError(f"expected {len(header)} cells")
            if d["measured_us"]:
                ctx = None if d["context"] in ("any", "") else int(d["context"])
                out[(d["arch"], int(d["cu_num"]), ShapeKey.parse(d), ctx)] = float(d["measured_us"])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{path}: report row {number}: {exc}") from None
    return out


def tasks_for(work: list[tuple[Point, int]], schedule, max_copies: int, lengths: str | None) -> list[Task]:
    """One dispatch timing per ``(point, context)``, its batch's lengths drawn as the row was
    tuned (``lengths``: this mode for every row instead)."""
    tasks = []
    for p, c in work:
        r = p.row
        mode = tuned_lengths(r.provenance) if lengths is None else lengths
        tasks.append(Task(id=len(tasks), shape=TuneKey(r.shape_key, p.contexts).shape(c, mode),
                          impls=[bench.Impl("dispatch")], screen=schedule,
                          workload={"max_copies": max_copies, "context_hint": "context" if r.context else None},
                          meta={"point": p, "context": c}))
    return tasks


class _Source:
    def __init__(self, tasks: list[Task], bar):
        self.tasks, self.bar = list(tasks), bar

    def next_task(self):
        return self.tasks.pop(0) if self.tasks else None

    def record(self, task, idx, stage, m):
        task.meta["point"].times[task.meta["context"]] = m

    def task_done(self, task):
        self.bar.update(1)


def recheck(table_path: str, *, baseline: str | None = None, fail_on_regression: bool = False, device: str | None = None,
            out: str | None = None, drift: float = DRIFT, warn: float = WARN, fail: float = FAIL,
            timeout: float = 180.0, replays: int | None = None, max_copies: int = 64, sample: int = 0,
            quiet: bool = False, lengths: str | None = None) -> int:
    """Re-time ``table_path``'s rows for this device (``sample``: at most that many, evenly
    spread; ``lengths``: one lengths mode for every row instead of each row's recorded one);
    print the report; return the exit status."""
    import torch
    from tqdm import tqdm

    from paged_mqa_logits.arch import detect

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    info = detect(torch.device("cuda:0" if device == "cuda" else device))
    points, note = points_for(table.parse_file(table_path), info.arch, info.cu_num)
    if note:
        print(f"[recheck] {note}")
    if not points:
        return 1
    if 0 < sample < len(points):
        points = [points[round(i * (len(points) - 1) / max(sample - 1, 1))] for i in range(sample)]
    base = read_baseline(baseline) if baseline else {}
    if baseline and not any(p.row.key in base for p in points):
        print(f"[recheck] the baseline {baseline} covers none of the {len(points)} row(s) checked: "
              "no regression can be judged", file=sys.stderr)
        return 1
    gpu = torch.device(device).type == "cuda"
    schedule = bench.Schedule(replays=replays or (10 if gpu else 3))
    work = []  # (point, context): a key's context row next to its "any" row, so they share inputs
    for p in points:
        work += [(p, c) for c in p.contexts]
    work.sort(key=lambda pc: ((pc[0].row.arch, pc[0].row.cu_num) + pc[0].row.shape_key.values(), pc[1],
                              pc[0].row.context is None))
    tasks = tasks_for(work, schedule, max_copies, lengths)
    env = {table.ENV_CONFIGS: os.path.abspath(table_path), table.ENV_CONFIGS_ALIAS: ""}
    pool = Pool([device if not gpu else "cuda:0"], timeout=timeout, env=env, log=print)
    bar = tqdm(total=len(tasks), unit="shape", disable=quiet, file=sys.stderr, dynamic_ncols=True)
    try:
        pool.run(_Source(tasks, bar))
    finally:
        bar.close()
        pool.close()

    report, failed, regressed = [], False, False
    for p in points:
        r = p.row
        note, verdict = classify(p.measured, r.us, base.get(r.key) if baseline else None, drift=drift, warn=warn,
                                 fail=fail)
        if baseline and r.key not in base:
            verdict = "no baseline"
        failed |= p.status != "ok"
        regressed |= verdict.startswith("FAIL")
        expected = f"{r.backend}[{bench.format_knobs(r.knobs)}]"
        report.append({
            "arch": r.arch, "cu_num": r.cu_num, **r.shape_key.cells(),
            "context": "any" if r.context is None else r.context,
            "lengths": (tuned_lengths(r.provenance) if lengths is None else lengths) or "uniform",
            "table_backend": expected, "ran": p.ran,
            "recorded_us": "" if r.us is None else f"{r.us:.3f}",
            "measured_us": "" if p.measured is None else f"{p.measured:.3f}",
            "baseline_us": f"{base[r.key]:.3f}" if r.key in base else "", "drift": note, "regression": verdict,
            "status": p.status if p.ran in ("", expected) or p.status != "ok" else f"ok (dispatch ran {p.ran})",
        })
    _print(report)
    if out:
        with atomic_write(out, newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(report[0]))
            w.writeheader()
            w.writerows(report)
    drifted = sum(1 for x in report if x["drift"].startswith("DRIFT"))
    print(f"[recheck] {len(report)} rows: {drifted} drifted beyond {drift:.0%}, "
          f"{sum(1 for x in report if x['regression'].startswith('WARN'))} WARN, "
          f"{sum(1 for x in report if x['regression'].startswith('FAIL'))} FAIL, "
          f"{sum(1 for x in report if not x['status'].startswith('ok'))} failed checks")
    return 1 if failed or (regressed and fail_on_regression) else 0


def _print(report: list[dict]) -> None:
    cols = ["heads", "preshuffle", "next_n", "batch", "context", "table_backend", "recorded_us", "measured_us",
            "baseline_us", "drift", "regression", "status"]
    rows = [cols] + [[str(x[c]) for c in cols] for x in report]
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
