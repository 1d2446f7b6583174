"""``--op topk``: tune the top-k op's table rows (``paged_mqa_logits/top_k/``) with the same
pick, provenance and writer as the logits rows.

An untuned top-k list has one key per line (``#`` lines are comments)::

    rows,k,logits_dtype,contexts
    256,2048,fp32,8192;32768;131072

``rows`` is batch x next_n, ``contexts`` the row widths to time at (optional, ``;``-separated;
``--contexts`` overrides it), ``logits_dtype`` optional (``fp32``). For each key and context the
tuner builds rotating copies of random rows (``bench/topk.py``: lengths uniform or ``--lengths
wide``), runs every candidate (backend x knobs, ``top_k/knobs.py``) once and checks it against
``torch.topk`` as a set (``bench.topk.selection_matches``) before timing it with the bench's
method (``bench.measure.time_calls``): a short screen of every survivor, then a confirm of the
``--top`` fastest. A candidate that fails anywhere is dropped everywhere; a key with no survivor
writes nothing. Candidates run in this process (each kernel specialisation compiles in seconds,
so a key's first context can take minutes), so ``--mp``, ``--jobs`` and ``--timeout`` do not
apply. A progress bar counts the (candidate, context) timings. ``--time-budget`` as for the logits
rows: once spent, no further context is started (a key with contexts left is left untuned, what an
earlier run wrote for it stays), and a context already running starts no further candidate past the
grace (``search.grace_seconds``): its key is left untuned too.
"""

from __future__ import annotations

import csv
import io
import sys
import time
from dataclasses import dataclass

import torch

from paged_mqa_logits.arch import gpu_name
from paged_mqa_logits.bench.measure import Schedule, time_calls
from paged_mqa_logits.bench.topk import RowShape, copies_for, selection_matches, sequence_lengths
from paged_mqa_logits.files import read_text
from paged_mqa_logits.problem import TopkKey
from paged_mqa_logits.top_k import knobs as topk_knobs
from paged_mqa_logits.top_k.backends import BACKENDS, launcher
from paged_mqa_logits.top_k.torch_ref import visible_lengths
from paged_mqa_logits.top_k.validate import MAX_K, check_call
from paged_mqa_logits.triton_internals.version import installed_version

from .candidates import Candidate, spread
from .keys import DEFAULT_CONTEXTS, TuneKey, coarse_to_fine, parse_contexts
from .search import Outcome, grace_seconds, print_summary, report_row, resolve_target, say, write_report
from .writer import provenance, read_existing, rows_for, tuned_shape_keys, write_key_rows

COLUMNS = ("rows", "k", "logits_dtype", "contexts")


def read_untuned(paths: list[str], contexts: tuple[int, ...] | None = None) -> list[TuneKey]:
    """The top-k keys of the files (``TuneKey`` s whose ``shape_key`` is a :class:`TopkKey`),
    de-duplicated; ``ValueError`` names the file, line and column of a malformed one."""
    merged: dict[TopkKey, set[int]] = {}
    for path in paths:
        lines = [(n, line) for n, line in enumerate(io.StringIO(read_text(path), newline=""), start=1)
                 if line.strip() and not line.lstrip().startswith("#")]
        if not lines:
            continue
        header = [c.strip() for c in next(csv.reader([lines[0][1]]))]
        missing = [c for c in ("rows", "k") if c not in header]
        if missing:
            raise ValueError(f"{path}:{lines[0][0]}: header lacks column(s) {', '.join(missing)} (a top-k list: "
                             f"{','.join(COLUMNS)})")
        for lineno, line in lines[1:]:
            cells = dict(zip(header, (c.strip() for c in next(csv.reader([line])))))
            try:
                key = TopkKey.parse(cells)
                if key.k > MAX_K:
                    raise ValueError(f"column k must be <= {MAX_K}, got {key.k}")
                ctx = contexts or parse_contexts(cells.get("contexts") or "") or DEFAULT_CONTEXTS
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
            merged.setdefault(key, set()).update(ctx)
    keys = [TuneKey(key, tuple(sorted(ctx))) for key, ctx in merged.items()]
    return sorted(keys, key=lambda t: (t.shape_key.k, t.shape_key.logits_dtype, t.shape_key.rows))


def candidates_for(key: TuneKey, target, names: list[str] | None = None, max_candidates: int = 0) -> list[Candidate]:
    """Every backend's knob configs for ``key`` (``torch`` only on CPU unless named), the
    defaults always among them."""
    on_cpu = target.device_type == "cpu"
    if names is None:
        names = [n for n in BACKENDS if n != "torch" or on_cpu]
    chosen: list[Candidate] = []
    for name in names:
        found = [Candidate.of(name, c) for ctx in key.contexts
                 for c in topk_knobs.candidates(name, on_cpu, key.shape_key.rows, ctx, target.cu_num)]
        default = Candidate.of(name, topk_knobs.default_config(name, on_cpu))
        chosen += spread(list(dict.fromkeys([default] + found)), max_candidates, [default])
    return chosen


@dataclass
class Timed:
    """One candidate at one (key, context, stage): what ``writer.pick`` reads."""

    us: float | None = None
    status: str = "ok"
    seconds: float = 0.0
    rotate: int = 0
    calc_diff: float | None = None
    mask_ok: bool | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def time_context(key: TuneKey, context: int, cands: list[Candidate], device: torch.device, lengths: str,
                 screen: Schedule, confirm: Schedule, top: int, max_copies: int, seed: int = 0, bar=None,
                 stop_at: float | None = None) -> dict | None:
    """``{(context, index, stage): Timed}``: every candidate checked, screened, the ``top``
    fastest confirmed; ``bar`` (a tqdm bar, or None) advances once a candidate. ``None`` when
    ``time.monotonic()`` passed ``stop_at`` before every candidate had started."""
    tk = key.shape_key
    shape = RowShape(batch=tk.rows, next_n=1, context=context, lengths=lengths or "uniform", k=tk.k)
    generator = torch.Generator().manual_seed(seed)
    lens = sequence_lengths(shape, generator)
    row_lens = visible_lengths(lens, 1, context).to(torch.int32).to(device)
    dtype = torch.bfloat16 if tk.logits_dtype == "bf16" else torch.float32
    copies = copies_for(shape, device, max_copies)
    rows = [torch.randn(tk.rows, context, generator=generator).to(dtype).to(device) for _ in range(copies)]
    lens = lens.to(device)
    outs = [torch.empty(tk.rows, tk.k, dtype=torch.int32, device=device) for _ in range(copies)]
    calls = [[(lambda c, i: lambda: launcher(c.backend)(check_call(rows[i], lens, 1, tk.k, outs[i]), c.knobs))(c, i)
              for i in range(copies)] for c in cands]
    results: dict = {}
    for idx, cand in enumerate(cands):
        if stop_at is not None and time.monotonic() >= stop_at:
            return None
        if bar is not None:
            bar.set_postfix_str(f"{key.describe()} context={context} {cand.label}", refresh=False)
        t0, rotate = time.perf_counter(), copies
        try:
            calls[idx][0]()
            if selection_matches(outs[0], rows[0].float(), row_lens, tk.k):
                status, us = "ok", time_calls(calls[idx], device, screen).us
            else:  # never timed
                status, us, rotate = "FAIL: not the exact top-k (as a set)", None, 0
        except Exception as exc:  # one candidate failing leaves the others
            status, us = f"ERROR: {type(exc).__name__}: {exc}"[:300], None
        results[(context, idx, "screen")] = Timed(us, status, time.perf_counter() - t0, rotate)
        if bar is not None:
            bar.update(1)
    passed = sorted((m.us, i) for (_, i, _), m in results.items() if m.ok)
    for _, idx in passed[:top]:
        t0 = time.perf_counter()
        timing = time_calls(calls[idx], device, confirm)
        results[(context, idx, "confirm")] = Timed(timing.us, "ok", time.perf_counter() - t0, copies)
    return results


def _write_key(opts, target, outcome, key: TuneKey, cands: list[Candidate], results: dict, prov: str) -> None:
    """Record a fully timed key's measurements and write its rows (nothing when no candidate passed)."""
    for (context, idx, stage), m in sorted(results.items(), key=lambda kv: kv[0]):
        outcome.measurements.append(report_row(target, key, context, stage, cands[idx], m))
        if not m.ok:
            outcome.rejected.append((f"{key.describe()} context={context}", cands[idx].label, m.status))
    rows = rows_for(key, target.arch, target.cu_num, cands, results, prov, allowed=BACKENDS)
    if not rows:
        say(opts, f"[tuner] {key.describe()}: no candidate passed; nothing written")
        outcome.failed.append(key)
        return
    write_key_rows(opts.out, rows, target.arch, target.cu_num, key.shape_key, prov)
    outcome.tuned.append(key)
    outcome.rows.extend(rows)


def plan(opts, target, outcome) -> list:
    """``[(key, candidates)]`` to tune: the keys of the untuned lists, less those the output
    already holds for ``target`` (unless ``--all``); ``--dry-run`` prints each key's candidates."""
    keys = read_untuned(opts.untuned, opts.contexts)
    unknown = [b for b in opts.backends or [] if b not in BACKENDS]
    if unknown:
        raise ValueError(f"argument --backends: expected top-k backends among {', '.join(BACKENDS)}, "
                         f"got unknown {', '.join(unknown)}")
    existing = read_existing(opts.out) if opts.out else []
    done = set() if opts.retune_all else tuned_shape_keys(existing, target.arch, target.cu_num,
                                                          {k.shape_key: k.contexts for k in keys})
    outcome.skipped = [k for k in keys if k.shape_key in done]
    todo = []
    for key in order_keys_topk(k for k in keys if k.shape_key not in done):
        cands = candidates_for(key, target, opts.backends, opts.max_candidates)
        if opts.dry_run:
            print(f"{key.describe()} contexts={','.join(map(str, key.contexts))}: {len(cands)} candidate(s)")
            for c in cands:
                print(f"    {c.label}")
        todo.append((key, cands))
    return todo


def order_keys_topk(keys) -> list[TuneKey]:
    """Coarse-to-fine in rows (``keys.coarse_to_fine``), as the logits keys in batch."""
    keys = list(keys)
    rank = coarse_to_fine(k.shape_key.rows for k in keys)
    return sorted(keys, key=lambda k: (rank[k.shape_key.rows], k.shape_key.k, k.shape_key.logits_dtype))


def tune(opts):
    """The ``--op topk`` run (module docstring); returns the run's ``search.Outcome``."""
    t0 = time.monotonic()
    target = resolve_target(opts)
    outcome = Outcome(target)
    todo = plan(opts, target, outcome)
    if outcome.skipped:
        say(opts, f"[tuner] {len(outcome.skipped)} top-k key(s) already in {opts.out} for "
                   f"{target.arch}/cu{target.cu_num}: skipped (--all re-tunes them)")
    if opts.dry_run or not todo:
        if opts.dry_run:
            total = sum(len(c) * len(k.contexts) for k, c in todo)
            print(f"{len(todo)} top-k key(s) to tune on {target.arch}/cu{target.cu_num}, {total} (candidate, context) "
                  "timings")
        outcome.seconds = time.monotonic() - t0
        return outcome
    gpu = target.device_type == "cuda"
    device = torch.device("cuda" if gpu else "cpu")
    prov = provenance(gpu_name() if gpu else "cpu", target.cu_num, installed_version() or "none", torch.__version__,
                      lengths=opts.lengths)
    screen = Schedule(replays=opts.screen_replays or 3, min_replay_us=1000.0 if gpu else 0.0)
    confirm = Schedule(replays=opts.confirm_replays or (10 if gpu else 3))
    deadline = t0 + opts.time_budget if opts.time_budget else None
    stop_at = deadline + grace_seconds(opts.time_budget) if deadline else None
    from tqdm import tqdm

    bar = tqdm(total=sum(len(c) * len(k.contexts) for k, c in todo), unit="timing", disable=opts.quiet,
               file=sys.stderr, dynamic_ncols=True)
    try:
        for position, (key, cands) in enumerate(todo):
            results: dict | None = {}
            for context in key.contexts:
                if deadline is not None and time.monotonic() >= deadline:
                    results = None
                    break
                timed = time_context(key, context, cands, device, opts.lengths, screen, confirm, opts.top,
                                     opts.max_copies, bar=bar, stop_at=stop_at)
                if timed is None:
                    results = None
                    break
                results.update(timed)
            if results is None:  # the budget: this key and every later one are left untuned
                outcome.left.extend(k for k, _ in todo[position:])
                say(opts, f"[tuner] time budget spent: no further candidates started; {len(outcome.left)} key(s) "
                          "left untuned (run again to resume)")
                break
            _write_key(opts, target, outcome, key, cands, results, prov)
    finally:
        bar.close()
    outcome.seconds = time.monotonic() - t0
    if opts.report:
        write_report(opts.report, outcome.measurements)
    print_summary(opts, outcome, [])
    return outcome
