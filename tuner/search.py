"""The tuning run: check and compile in parallel, time with pruning, pick, write.

1. **Check/compile** (``--jobs J`` processes, GPU only): one task per kernel family (keys that
   differ only in batch) and chunk of candidates, at the family's smallest and largest batch
   and the smallest context. Every candidate is launched once (Triton/Gluon JIT-compile it and
   fill the on-disk kernel cache, in parallel) and checked against the reference; a rejected
   candidate is dropped for its family and reported with its reason. Optional: the timing
   stage checks every candidate again on every shape it times.
2. **Time** (``--mp N`` processes, one per GPU): one task per (key, context). The worker builds
   the rotating inputs once, *screens* every surviving candidate with a short schedule, then
   *confirms* the ``--top K`` fastest with the full schedule (:mod:`paged_mqa_logits.bench`).
3. **Pick and write** (after each key, so an interrupted run keeps its progress): the fastest
   candidate per context, and the best geometric mean over the key's contexts as the
   ``context=any`` row, merged into the output file atomically.

``--time-budget S`` (at least :data:`MIN_TIME_BUDGET` from the command line) bounds the whole run: the check stage may use half of it (what it did not
reach is checked while timing), the confirm stage is dropped when the remaining keys would not
fit otherwise, and keys that do not fit at all are left out (keys run coarse-to-fine in batch,
so the nearest-batch rule covers them; a later run resumes them).
"""

from __future__ import annotations

import csv
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from paged_mqa_logits import backends, bench, table
from paged_mqa_logits.files import atomic_write
from paged_mqa_logits.problem import Target

from .candidates import Candidate, candidates_for, load_extra_backends
from .keys import TuneKey, order_keys, read_untuned
from .worker import Pool, Task
from .writer import geomean, provenance, read_existing, rows_for, tuned_shape_keys, write_key_rows


#: the shortest ``--time-budget`` the command line accepts. Nothing is written before one
#: (key, context) task finishes: a worker process starts (imports torch, Triton and the package),
#: builds the task's inputs and reference, and compiles and screens each candidate of the key
#: once, which takes tens of seconds even on a GPU (on CPU, through the Triton interpreter,
#: minutes); a started task gets a grace past the budget (:func:`grace_seconds`), no more.
MIN_TIME_BUDGET = 60.0
WHY_MIN_TIME_BUDGET = ("nothing is written before a worker process has started and finished one (key, context) "
                       "task: inputs built, every candidate of the key compiled and timed once")


def grace_seconds(time_budget: float) -> float:
    """How long past the budget a (key, context) task already started may still run: 5% of the
    budget, at least 30 s."""
    return max(30.0, 0.05 * time_budget)


@dataclass
class Options:
    untuned: list[str]
    out: str | None  # the table to write; only --dry-run goes without
    contexts: tuple[int, ...] | None = None
    backends: list[str] | None = None
    retune_all: bool = False
    dry_run: bool = False
    device: str | None = None  # "cuda" / "cpu"; default: a GPU if present
    arch: str | None = None  # --dry-run only: describe another target
    cu_num: int | None = None
    mp: int = 1
    jobs: int | None = None  # check/compile processes; default 16 on GPU (capped by CPUs), 0 on CPU
    timeout: float = 180.0  # per candidate, compile included
    build_timeout: float = 600.0  # building one shape's inputs and reference
    time_budget: float | None = None
    top: int = 3
    max_candidates: int = 0  # per backend and key; 0 = all
    max_copies: int = 64
    screen_replays: int | None = None
    confirm_replays: int | None = None
    report: str | None = None
    quiet: bool = False
    #: the op whose rows are tuned: "mqa_logits" (the logits op) or "topk" (``tuner/topk.py``)
    op: str = "mqa_logits"
    #: per-sequence lengths of the timed batches: "" (every sequence at the context) or a
    #: ``bench.shapes.LENGTH_MODES`` ragged mode ("wide": uniform in [1, context], as in serving)
    lengths: str = ""


@dataclass
class KeyRun:
    key: TuneKey
    candidates: list[Candidate]
    results: dict = field(default_factory=dict)  # (context, index, stage) -> Measurement
    contexts_left: int = 0
    confirm_top: int = 0
    finished: bool = False


@dataclass
class Outcome:
    target: Target
    rows: list = field(default_factory=list)  # table.Row written by this run
    tuned: list = field(default_factory=list)  # TuneKey
    skipped: list = field(default_factory=list)  # TuneKey already in the output
    left: list = field(default_factory=list)  # TuneKey not reached (time budget)
    failed: list = field(default_factory=list)  # TuneKey no candidate passed (or no backend serves)
    too_large: list = field(default_factory=list)  # TuneKey whose inputs fit the free memory at no context
    rejected: list = field(default_factory=list)  # (where, candidate label, status)
    measurements: list = field(default_factory=list)  # report rows (dicts)
    seconds: float = 0.0
    restarts: int = 0


def resolve_target(opts: Options) -> Target:
    import torch

    from paged_mqa_logits.arch import USUAL_CU_NUM, detect, normalise_arch

    device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if opts.arch:
        if not opts.dry_run:
            raise ValueError("argument --arch: expected only together with --dry-run (it describes another "
                             f"target), got {opts.arch!r} without it")
        arch = normalise_arch(opts.arch)
        cu = opts.cu_num if opts.cu_num is not None else USUAL_CU_NUM.get(arch, 0)
        return Target.described(arch, cu)
    info = detect(torch.device(device if device != "cuda" else "cuda:0"))
    return Target(info.arch, info.cu_num, torch.device(device).type)


def say(opts: Options, text: str) -> None:
    """Print a progress line without breaking the progress bar (the top-k tuner's too)."""
    from tqdm import tqdm

    tqdm.write(text, file=sys.stdout)


# ----------------------------------------------------------------------------- stage 1: check/compile
class CheckStage:
    """Task source: (family, candidate chunk) at the family's batch extremes, smallest context."""

    def __init__(self, runs: list[KeyRun], jobs: int, bar):
        families: dict[tuple, list[KeyRun]] = {}
        for run in runs:
            families.setdefault(run.key.family, []).append(run)
        self.failed: dict[tuple, dict[Candidate, str]] = {}  # family -> candidate -> status
        #: family -> a key of it, which describes it
        self.family_keys = {family: members[0].key.shape_key for family, members in families.items()}
        self.tasks: deque[Task] = deque()
        per_family = []
        for family, members in families.items():
            cands = list(dict.fromkeys(c for r in members for c in r.candidates))
            reps = {min(members, key=lambda r: r.key.shape_key.batch).key,
                    max(members, key=lambda r: r.key.shape_key.batch).key}
            per_family.append((family, cands, reps))
        # About two tasks per process among the first batches, which do the compiling.
        chunk = max(1, -(-sum(len(c) for _, c, _ in per_family) // max(2 * jobs, 1)))
        # Every family's first batch before any second one: the second finds its kernels in the
        # disk cache instead of compiling them a second time in parallel.
        for rank in range(2):
            for family, cands, reps in per_family:
                ordered = sorted(reps, key=lambda k: k.shape_key.batch)
                if rank >= len(ordered):
                    continue
                key = ordered[rank]
                for start in range(0, len(cands), chunk):
                    part = cands[start:start + chunk]
                    self.tasks.append(Task(
                        id=len(self.tasks), shape=key.shape(min(key.contexts)),
                        impls=[bench.Impl.of(c.backend, c.knobs) for c in part],
                        workload={"copies": 1}, meta={"family": family, "candidates": part, "key": key}))
        self.bar = bar
        bar.reset(total=len(self.tasks))

    def next_task(self):
        return self.tasks.popleft() if self.tasks else None

    def record(self, task, idx, stage, m):
        if not m.ok and not m.status.startswith(bench.SKIPPED_FOR_MEMORY):  # too large to check: the timing stage says so
            self.failed.setdefault(task.meta["family"], {})[task.meta["candidates"][idx]] = m.status

    def task_done(self, task):
        self.bar.update(1)


# ----------------------------------------------------------------------------- stage 2: timing
class TimeStage:
    """Task source: (key, context) tasks, key by key, with the time budget's decisions."""

    def __init__(self, runs: list[KeyRun], opts: Options, target: Target, prov: str, workers: int,
                 deadline: float | None, bar, on_key_done):
        self.queue = deque(runs)
        self.pending: deque[Task] = deque()
        self.opts, self.target, self.prov, self.workers = opts, target, prov, workers
        self.deadline, self.bar, self.on_key_done = deadline, bar, on_key_done
        self.left: list[TuneKey] = []
        gpu = target.device_type == "cuda"
        self.screen = bench.Schedule(replays=opts.screen_replays or 3, min_replay_us=1000.0 if gpu else 0.0)
        self.confirm = bench.Schedule(replays=opts.confirm_replays or (10 if gpu else 3))
        self.cost = {"screen": [], "confirm": [], "build": []}  # seconds per measurement / per task
        self.next_id = 0
        self.budget_spent = False

    # -- estimates for the budget
    def _mean(self, what: str) -> float | None:
        xs = self.cost[what]
        return sum(xs) / len(xs) if xs else None

    def _estimate(self, run: KeyRun, confirm: bool) -> float | None:
        screen, build = self._mean("screen"), self._mean("build")
        if screen is None or build is None:
            return None
        per_context = build + len(run.candidates) * screen
        if confirm:
            per_context += min(self.opts.top, len(run.candidates)) * (self._mean("confirm") or screen)
        return per_context * len(run.key.contexts)

    def _plan(self, run: KeyRun) -> int | None:
        """Confirm-stage size for the next key, or None to stop starting keys."""
        if self.deadline is None:
            return self.opts.top
        remaining = self.deadline - time.monotonic()
        full, lean = self._estimate(run, True), self._estimate(run, False)
        if full is None:
            return self.opts.top if remaining > 0 else None
        keys_left = max(len(self.queue), 1)  # the queue still holds ``run``
        if keys_left * full / self.workers <= remaining:
            return self.opts.top
        if lean / self.workers <= remaining:
            return 0
        return None

    # -- the source interface
    def next_task(self):
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return self._stop_for_budget()
        if self.pending:
            return self.pending.popleft()
        if not self.queue:
            return None
        run = self.queue[0]
        top = self._plan(run)
        if top is None:
            return self._stop_for_budget()
        self.queue.popleft()
        run.confirm_top, run.contexts_left = top, len(run.key.contexts)
        impls = [bench.Impl.of(c.backend, c.knobs) for c in run.candidates]
        for context in run.key.contexts:
            self.pending.append(Task(
                id=self.next_id, shape=run.key.shape(context, self.opts.lengths), impls=impls, screen=self.screen,
                confirm=self.confirm, confirm_top=top, workload={"max_copies": self.opts.max_copies},
                meta={"run": run, "context": context}))
            self.next_id += 1
        return self.pending.popleft()

    def _stop_for_budget(self) -> None:
        """Start nothing more: neither the rest of a started key's contexts (that key is left
        untuned; what an earlier run wrote for it stays) nor another key. Says so once."""
        if not self.budget_spent:
            self.budget_spent = True
            started = list(dict.fromkeys(t.meta["run"].key for t in self.pending))
            self.left = started + [r.key for r in self.queue]
            self.pending.clear()
            self.queue.clear()
            if self.left:
                say(self.opts, f"[tuner] time budget spent: no further candidates started; {len(self.left)} key(s) "
                                "left untuned (run again to resume)")
        return None

    def record(self, task, idx, stage, m):
        task.meta["run"].results[(task.meta["context"], idx, stage)] = m
        if m.seconds:
            self.cost[stage].append(m.seconds)

    def task_done(self, task):
        run = task.meta["run"]
        measured = sum(m.seconds for m in task.results.values())
        self.cost["build"].append(max(0.0, time.monotonic() - task.started - measured))
        run.contexts_left -= 1
        self.bar.update(1)
        if run.contexts_left == 0:
            self.on_key_done(run)


# ----------------------------------------------------------------------------- the run
def report_row(target: Target, key: TuneKey, context, stage: str, cand: Candidate, m) -> dict:
    """One row of the tuner's report CSV: the key, the candidate and its measurement."""
    return {
        "arch": target.arch, "cu_num": target.cu_num, **key.shape_key.cells(), "context": context, "stage": stage, "backend": cand.backend,
        "knobs": bench.format_knobs(cand.knobs), "us": "" if m.us is None else f"{m.us:.3f}",
        "calc_diff": "" if m.calc_diff is None else f"{m.calc_diff:.2e}",
        "mask_ok": "" if m.mask_ok is None else int(m.mask_ok), "rotate": m.rotate, "status": m.status,
        "seconds": f"{m.seconds:.2f}",
    }


def fixed_config_summary(runs: list[KeyRun]) -> list[str]:
    """Tuned picks against every single fixed candidate timed at every (key, context), on the
    screen stage's times (every candidate has one at every point, so the comparison is fair)."""
    points, by_label = [], {}
    for run in runs:
        for context in run.key.contexts:
            times = {run.candidates[i].label: m.us for (c, i, s), m in run.results.items()
                     if c == context and s == "screen" and m.ok and m.us}
            allowed = {lbl: us for lbl, us in times.items() if lbl.split("[")[0] in table.KNOWN_BACKENDS}
            if not allowed:
                continue
            points.append(min(allowed.values()))
            for lbl, us in allowed.items():
                by_label.setdefault(lbl, {})[len(points) - 1] = us
    if not points:
        return []
    full = {lbl: ts for lbl, ts in by_label.items() if len(ts) == len(points)}
    lines = []
    if full:
        ratios = {lbl: geomean(ts[p] / points[p] for p in range(len(points))) for lbl, ts in full.items()}
        best = min(ratios, key=ratios.get)
        lines.append(f"tuned picks vs the best single fixed config {best}: {ratios[best]:.3f}x "
                     f"(geomean over {len(points)} (key, context) points, screen timings; "
                     f"{(1 - 1 / ratios[best]) * 100:.1f}% less time)")
    return lines


def tune(opts: Options) -> Outcome:
    """Run the tuner (see the module docstring); returns what it did. ``op="topk"`` tunes
    the top-k op's rows instead (``tuner/topk.py``)."""
    if opts.op == "topk":
        from .topk import tune as tune_topk

        return tune_topk(opts)
    if opts.op != "mqa_logits":
        raise ValueError(f"argument --op: expected mqa_logits or topk, got {opts.op!r}")
    t0 = time.monotonic()
    deadline = t0 + opts.time_budget if opts.time_budget else None
    load_extra_backends()
    unknown = [b for b in opts.backends or [] if b not in backends.names()]
    if unknown:
        raise ValueError(f"argument --backends: expected names among {', '.join(backends.names())}, "
                         f"got unknown {', '.join(unknown)}")
    target = resolve_target(opts)
    outcome = Outcome(target)
    runs = plan_runs(opts, target, outcome)
    if opts.dry_run or not runs:
        if opts.dry_run:
            total = sum(len(r.candidates) * len(r.key.contexts) for r in runs)
            print(f"{len(runs)} key(s) to tune on {target.arch}/cu{target.cu_num}, {total} (candidate, context) timings")
        outcome.seconds = time.monotonic() - t0
        return outcome

    written = time_runs(opts, target, outcome, runs, t0, deadline)
    outcome.rows = written
    outcome.seconds = time.monotonic() - t0
    outcome.left = [r.key for r in runs if r.candidates and not r.finished]
    if opts.report:
        write_report(opts.report, outcome.measurements)
    print_summary(opts, outcome, [r for r in runs if r.key in outcome.tuned])
    return outcome


def plan_runs(opts: Options, target, outcome: Outcome) -> list[KeyRun]:
    """The keys to tune (those the output table already holds for the target are skipped
    unless ``--all``), each with its candidates; a key no backend can serve goes to
    ``outcome.failed``. With ``--dry-run`` prints each key's candidates."""
    keys = order_keys(read_untuned(opts.untuned, opts.contexts))
    existing = read_existing(opts.out) if opts.out else []  # --dry-run needs no output file
    done = set() if opts.retune_all else tuned_shape_keys(existing, target.arch, target.cu_num,
                                                          {k.shape_key: k.contexts for k in keys})
    outcome.skipped = [k for k in keys if k.shape_key in done]
    todo = [k for k in keys if k.shape_key not in done]
    if outcome.skipped:
        say(opts, f"[tuner] {len(outcome.skipped)} key(s) already in {opts.out} for {target.arch}/cu{target.cu_num}: "
                   "skipped (--all re-tunes them)")

    runs = []
    for key in todo:
        cands, skipped = candidates_for(key, target, opts.backends, opts.max_candidates)
        if opts.dry_run:
            print(f"{key.describe()} contexts={','.join(map(str, key.contexts))}: {len(cands)} candidate(s)")
            for c in cands:
                print(f"    {c.label}")
            for name, why in skipped.items():
                print(f"    ({name} cannot serve: {why})")
        if cands:
            runs.append(KeyRun(key, cands))
        else:
            outcome.failed.append(key)
            outcome.rejected.append((key.describe(), "-", "no backend can serve this key: " + "; ".join(
                f"{n}: {w}" for n, w in skipped.items())))
    return runs


def time_runs(opts: Options, target, outcome: Outcome, runs: list[KeyRun], t0: float,
              deadline: float | None) -> list:
    """Check and compile every candidate in worker processes, then time them; each key's rows
    are written to the output table as soon as its timings are in. The rows written."""
    from tqdm import tqdm

    import torch

    from paged_mqa_logits.arch import gpu_name

    gpu = target.device_type == "cuda"
    ngpu = torch.cuda.device_count() if gpu else 0
    mp = max(1, min(opts.mp, ngpu)) if gpu else 1
    timing_devices = [f"cuda:{i}" for i in range(mp)] if gpu else ["cpu"]
    jobs = opts.jobs if opts.jobs is not None else (min(16, os.cpu_count() or 1) if gpu else 0)
    from paged_mqa_logits.triton_internals.version import installed_version

    # the torch backend tunes without Triton: its provenance then says "none"
    prov = provenance(gpu_name() if gpu else "cpu", target.cu_num, installed_version() or "none", torch.__version__,
                      lengths=opts.lengths)
    check_devices = [f"cuda:{i % ngpu}" if gpu else "cpu" for i in range(jobs)]
    pool = Pool(check_devices or timing_devices, timeout=opts.timeout, build_timeout=opts.build_timeout,
                log=lambda text: say(opts, text))
    written: list = []

    def key_done(run: KeyRun) -> None:
        run.finished = True
        too_large = {}  # context -> why its inputs were not built
        for (context, idx, stage), m in sorted(run.results.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
            outcome.measurements.append(report_row(target, run.key, context, stage, run.candidates[idx], m))
            if m.status.startswith(bench.SKIPPED_FOR_MEMORY):
                too_large[context] = m.status
            elif not m.ok:
                outcome.rejected.append((f"{run.key.describe()} context={context}", run.candidates[idx].label, m.status))
        for context, status in too_large.items():
            say(opts, f"[tuner] {run.key.describe()} context={context}: {status}")
        ran = tuple(c for c in run.key.contexts if c not in too_large)
        if not ran:  # the device's size, not the candidates' fault: not a failure
            outcome.too_large.append(run.key)
            return
        # the key's rows (its ``any`` row too) cover the contexts that fit
        rows = rows_for(TuneKey(run.key.shape_key, ran), target.arch, target.cu_num, run.candidates, run.results, prov)
        if not rows:
            say(opts, f"[tuner] {run.key.describe()}: no candidate passed; nothing written")
            outcome.failed.append(run.key)
            return
        outcome.tuned.append(run.key)
        written.extend(rows)
        # rows of this key from an earlier run go, whatever contexts they had; the rest stays
        write_key_rows(opts.out, rows, target.arch, target.cu_num, run.key.shape_key, prov)
        best = min(rows, key=lambda r: (r.context is not None, r.us or 0))
        bar.set_postfix_str(f"{run.key.describe()}: {best.backend} {best.us:.2f} us"[:80])

    bar = tqdm(total=0, unit="task", disable=opts.quiet, file=sys.stderr, dynamic_ncols=True)
    try:
        if jobs:
            bar.set_description("check+compile")
            stage = CheckStage(runs, jobs, bar)
            finished = pool.run(stage, deadline=t0 + opts.time_budget / 2 if opts.time_budget else None)
            if not finished:
                say(opts, "[tuner] check stage stopped at half the time budget; the rest is checked while timing")
            for family, failed in stage.failed.items():
                where = f"{stage.family_keys[family].describe_family()} (check stage)"
                outcome.rejected += [(where, cand.label, status) for cand, status in failed.items()]
            for run in runs:
                failed = stage.failed.get(run.key.family, {})
                run.candidates = [c for c in run.candidates if c not in failed]
            pool.resize(timing_devices)
        bar.set_description("time")
        timed = TimeStage([r for r in runs if r.candidates], opts, target, prov, len(timing_devices), deadline,
                          bar, key_done)
        bar.reset(total=sum(len(r.key.contexts) for r in timed.queue))
        pool.run(timed, deadline=deadline + grace_seconds(opts.time_budget) if deadline else None)
    finally:
        bar.close()
        outcome.restarts = pool.restarts
        pool.close()
    return written


def write_report(path: str, rows: list[dict]) -> None:
    if not rows:
        return
    with atomic_write(path, newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def print_summary(opts: Options, outcome: Outcome, runs: list[KeyRun]) -> None:
    t = outcome.target
    print(f"[tuner] {len(outcome.tuned)} key(s) tuned on {t.arch}/cu{t.cu_num} ({len(outcome.rows)} rows -> {opts.out}) "
          f"in {outcome.seconds:.0f} s; {len(outcome.skipped)} skipped as already tuned; "
          f"{len(outcome.left)} left untuned; {len(outcome.failed)} failed; {len(outcome.too_large)} too large for "
          f"the free memory; {outcome.restarts} worker restart(s)")
    if outcome.left:
        print("[tuner] not tuned (time budget; run again to resume): "
              + ", ".join(f"b{s.batch}/n{s.next_n}/H{s.heads}/p{int(s.preshuffle)}" if s.op == "mqa_logits"
                          else f"rows{s.rows}/k{s.k}" for s in (k.shape_key for k in outcome.left)))
    if outcome.rejected:
        print(f"[tuner] {len(outcome.rejected)} rejected (candidate, shape) pairs:")
        for where, label, status in outcome.rejected[:20]:
            print(f"    {label} at {where}: {status}")
        if len(outcome.rejected) > 20:
            print(f"    ... {len(outcome.rejected) - 20} more (see --report)")
    for line in fixed_config_summary(runs):
        print("[tuner] " + line)
