"""``python -m paged_mqa_logits bench --indexer``: the indexer step (:func:`paged_mqa_logits.indexer_topk`:
the logits, then the top-k of every row) timed in the same run as the logits op alone and as the engines'
pair, with the logits bench's method (docs/BENCHMARK.md, ``measure.py``: rotating ``make_inputs`` copies
past L2, warm-up outside capture, the median of CUDA-graph replays divided by the calls in the graph).

Rows per shape:

* ``ours_logits``: the logits op (the production dispatch, ``clean_logits=False``);
* ``ours_step``: the step, one call (both ops' dispatch);
* ``deepgemm_logits`` (``--deepgemm``): DeepGEMM's ``fp8_paged_mqa_logits``, as the logits bench runs it;
* ``deepgemm+vllm`` (``--deepgemm --vllm DIR``): DeepGEMM's logits then one of vLLM's staged top-k kernels
  (``bench --topk``'s calls), both in every graph; each of vLLM's kernels is timed so and the faster pair
  is the row (``backend`` names the kernel).

Bytes of a step = the logits call's (KV read + logits written, the logits bench's count) + the top-k's
(visible logits read + selection written, ``bench --topk``'s count); the engines' pair is charged the same.
``speedup_vs_engines`` = deepgemm+vllm time / ours_step time; ``step_over_logits`` = a step's time over its
own logits call's (ours_step / ours_logits, deepgemm+vllm / deepgemm_logits). Checked on the first copy:
the logits against the reference as the logits bench checks them, and every selection against
``torch.topk`` over each visible row as multisets (``bench --topk``'s check)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Callable

import torch

from ..arch import detect
from ..cli import ArgumentParser
from ..indexer import check_topk, indexer_topk
from ..top_k import BACKENDS, MAX_K
from ..top_k.backends import choose as choose_topk
from ..top_k.torch_ref import visible_lengths
from .deepgemm import deepgemm_calls, deepgemm_unsupported
from .environment import environment
from .measure import (DeviceLost, Impl, Measurement, Schedule, accuracy_status, capture_status, check, measure,
                      time_calls)
from .report import fmt, geomean
from .shapes import Shape, grid_shapes, shape_error
from .topk import (LENGTHS, RowShape, header_lines, implementations, int_options, load_vllm, selection_matches,
                   useful_bytes, write_csv)
from .workload import SKIPPED_FOR_MEMORY, ShapeDoesNotFit, Workload, build_workload

GPU_DEFAULTS = {"heads": "64", "next_n": "1,2,4", "batch": "32,64,128,256", "context": "8192,32768", "k": "2048",
                "kv_block_size": "64"}
CPU_DEFAULTS = {"heads": "16", "next_n": "1,2", "batch": "2", "context": "64", "k": "8", "kv_block_size": "16"}
COLUMNS = ["impl", "backend", "H", "next_n", "batch", "context", "lengths", "k", "kv_block_size", "lens_2d", "us",
           "GBps", "frac_of_copy_bw", "calc_diff", "exact", "rotate", "calls", "timing", "speedup_vs_engines",
           "step_over_logits", "status"]
#: ``--lengths`` -> :attr:`Shape.ragged`
RAGGED = {"uniform": "", "wide": "wide"}
#: the logits check's threshold (the logits bench's)
THRESHOLD = 1e-3
METHOD = ("docs/TOPK.md (The indexer step) and docs/BENCHMARK.md -- rotating make_inputs copies past L2, median of "
          "CUDA-graph replays / calls; bytes = KV (D+4 per walked token) + logits written + visible logits read "
          "(4 each) + selection written (4 a slot)")


def lengths_name(shape: Shape) -> str:
    return next(name for name, ragged in RAGGED.items() if ragged == shape.ragged)


def base_row(shape: Shape, k: int, impl: str) -> dict:
    key = shape.shape_key
    return {"impl": impl, "H": key.heads, "next_n": key.next_n, "batch": key.batch, "context": shape.context,
            "lengths": lengths_name(shape), "k": k, "kv_block_size": key.kv_block_size, "lens_2d": shape.lens_2d,
            "status": "ok"}


def measured_row(row: dict, m: Measurement) -> dict:
    """``row`` with a logits measurement's figures (``measure``'s)."""
    row.update(backend=m.backend, us=m.us, GBps=m.gbps, frac_of_copy_bw=m.frac_of_copy_bw, calc_diff=m.calc_diff,
               rotate=m.rotate, calls=m.calls or None, timing=m.timing or None, status=m.status)
    return row


def timed_row(row: dict, calls: list[Callable], workload: Workload, schedule: Schedule, nbytes: int,
              copy_gbps: float | None) -> dict:
    """``row`` with the timing of ``calls`` (one per copy), charged ``nbytes`` a call; left untimed
    when the row's check failed."""
    if row["status"] != "ok":
        return row
    timing = time_calls(calls, workload.device, schedule)
    gbps = nbytes / timing.us / 1e3
    row.update(us=timing.us, GBps=gbps, frac_of_copy_bw=gbps / copy_gbps if copy_gbps else None,
               rotate=workload.copies, calls=timing.calls, timing=timing.method,
               status=capture_status(timing) or row["status"])
    return row


def step_calls(workload: Workload, k: int, outs: list[torch.Tensor], topk_backend: str | None) -> list[Callable]:
    """One :func:`indexer_topk` call per copy, into the copy's logits and ``outs[i]``."""
    def call(inp: dict, out: torch.Tensor) -> Callable:
        return lambda: indexer_topk(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"],
                                    inp["kv_indices"], inp["max_model_len"], k, Preshuffle=inp["preshuffle"],
                                    KVBlockSize=inp["kv_block_size"], out_logits=inp["out_logits"], out=out,
                                    context_hint=workload.context_hint, q_scale=inp["q_scale"],
                                    topk_backend=topk_backend)
    return [call(inp, out) for inp, out in zip(workload.inputs, outs)]


def row_lengths(workload: Workload, width: int) -> list[torch.Tensor]:
    """Per copy, int32 ``[rows]``: each row's visible positions."""
    next_n = workload.shape.shape_key.next_n
    return [visible_lengths(inp["context_lens"], next_n, width).to(torch.int32) for inp in workload.inputs]


def measure_step(row: dict, workload: Workload, k: int, topk_backend: str | None, logits_backend: str | None,
                 schedule: Schedule, nbytes: int, copy_gbps: float | None) -> dict:
    args = workload.args[0]
    outs = [torch.empty(args.problem.rows, k, dtype=torch.int32, device=workload.device) for _ in workload.inputs]
    call = check_topk(args, k, outs[0], None, 1, topk_backend)
    row["backend"] = f"{logits_backend}+{choose_topk(call, topk_backend).backend}"
    calls = step_calls(workload, k, outs, topk_backend)
    calc_diff, mask_ok = check(Impl("dispatch"), workload, calls[0])
    row.update(calc_diff=calc_diff, exact=selection_matches(outs[0], call.logits,
                                                            row_lengths(workload, call.logits.shape[1])[0], k))
    row["status"] = accuracy_status(calc_diff, mask_ok, THRESHOLD)
    if not row["exact"]:
        row["status"] = ("FAIL: not the exact top-k" if row["status"] == "ok"
                         else row["status"] + "; not the exact top-k")
    return timed_row(row, calls, workload, schedule, nbytes, copy_gbps)


def engine_pairs(workload: Workload, k: int, vllm) -> dict[str, list[Callable]]:
    """vLLM kernel label -> one call per copy: DeepGEMM's logits, then that kernel on them (returning the
    logits). vLLM's kernels take the 1-D sequence lengths (and persistent_topk each row's length)."""
    key = workload.shape.shape_key
    width = workload.inputs[0]["max_model_len"]
    row_shape = RowShape(key.batch, key.next_n, width, lengths_name(workload.shape), k)
    logits_calls = deepgemm_calls(workload)
    per_row = row_lengths(workload, width)
    seq_lens = [lens[:, -1].contiguous() if lens.dim() == 2 else lens
                for lens in (inp["context_lens"] for inp in workload.inputs)]
    pairs = {}
    for label, kernel in implementations(row_shape, [], vllm).items():
        if not label.startswith("vllm:"):
            continue
        outs = [torch.empty(key.batch * key.next_n, k, dtype=torch.int32, device=workload.device)
                for _ in workload.inputs]

        def pair(i: int, kernel=kernel, outs=outs) -> Callable:
            def run() -> torch.Tensor:
                logits = logits_calls[i]()
                kernel(logits, seq_lens[i], per_row[i], outs[i])
                return logits
            run.out = outs[i]
            return run
        pairs[label] = [pair(i) for i in range(workload.copies)]
    return pairs


def measure_engines(row: dict, workload: Workload, k: int, vllm, schedule: Schedule, nbytes: int,
                    copy_gbps: float | None) -> dict:
    """The faster of DeepGEMM + each vLLM kernel (each checked on copy 0 first)."""
    best = None
    for label, calls in engine_pairs(workload, k, vllm).items():
        candidate = dict(row, backend=f"deepgemm+{label}")
        try:
            logits = calls[0]()
            width = workload.inputs[0]["max_model_len"]
            candidate["exact"] = selection_matches(calls[0].out, logits[:, :width],
                                                   row_lengths(workload, width)[0], k)
            if not candidate["exact"]:
                candidate["status"] = "FAIL: not the exact top-k"
            timed_row(candidate, calls, workload, schedule, nbytes, copy_gbps)
        except Exception as exc:  # one kernel failing leaves the other's pair
            candidate["status"] = f"ERROR: {type(exc).__name__}: {exc}"[:300]
        if best is None or (candidate.get("us") and (not best.get("us") or candidate["us"] < best["us"])):
            best = candidate
    return best if best is not None else dict(row, status="skipped: the --vllm module has none of vLLM's kernels")


def impl_names(a) -> list[str]:
    return ["ours_logits", "ours_step"] + (["deepgemm_logits"] if a.deepgemm else []) + \
        (["deepgemm+vllm"] if a.deepgemm and a.vllm else [])


def measure_shape(a, shape: Shape, k: int, vllm, vllm_missing: str | None, device: torch.device, env,
                  schedule: Schedule) -> list[dict]:
    """Every row of one shape (see the module docstring); never raises for a failing implementation
    (``DeviceLost`` aside)."""
    rows = {impl: base_row(shape, k, impl) for impl in impl_names(a)}
    try:
        workload = build_workload(shape, device, copies=a.copies, max_copies=a.max_copies, seed=a.seed, arch=env.arch)
    except ShapeDoesNotFit as exc:  # the device's size, not a failure
        return [dict(r, status=f"{SKIPPED_FOR_MEMORY}{exc}") for r in rows.values()]
    except Exception as exc:
        return [dict(r, status=f"ERROR: building inputs: {type(exc).__name__}: {exc}"[:300]) for r in rows.values()]
    key = shape.shape_key
    nbytes = workload.accounting.bytes + useful_bytes(RowShape(key.batch, key.next_n, shape.context,
                                                               lengths_name(shape), k),
                                                      torch.tensor(workload.lens, dtype=torch.int32))
    ours = measure(Impl("dispatch"), workload, schedule, copy_gbps=env.copy_gbps)
    measured_row(rows["ours_logits"], ours)
    try:
        measure_step(rows["ours_step"], workload, k, a.topk_backend, ours.backend, schedule, nbytes, env.copy_gbps)
    except Exception as exc:
        rows["ours_step"]["status"] = f"ERROR: {type(exc).__name__}: {exc}"[:300]
    if a.deepgemm:
        theirs = measure(Impl("deepgemm"), workload, schedule, copy_gbps=env.copy_gbps)
        measured_row(rows["deepgemm_logits"], theirs)
        if a.vllm:
            engines = rows["deepgemm+vllm"]
            reasons = [r for r in (deepgemm_unsupported(shape, detect(device).arch), vllm_missing) if r]
            if reasons:
                engines["status"] = "skipped: " + "; ".join(reasons)
            else:
                rows["deepgemm+vllm"] = measure_engines(engines, workload, k, vllm, schedule, nbytes, env.copy_gbps)
    ratios(rows)
    return list(rows.values())


def ratios(rows: dict[str, dict]) -> None:
    """``speedup_vs_engines`` and ``step_over_logits`` where both times of a ratio are there."""
    us = {impl: row.get("us") for impl, row in rows.items()}
    if us.get("ours_step") and us.get("deepgemm+vllm"):
        rows["ours_step"]["speedup_vs_engines"] = us["deepgemm+vllm"] / us["ours_step"]
    for step, logits in (("ours_step", "ours_logits"), ("deepgemm+vllm", "deepgemm_logits")):
        if us.get(step) and us.get(logits):
            rows[step]["step_over_logits"] = us[step] / us[logits]


def summary(results: list[dict]) -> list[str]:
    """Per length mode: the geomean (and the range) of both ratios over the shapes that have them."""
    lines = []
    for mode in LENGTHS:
        steps = [r for r in results if r["impl"] == "ours_step" and r["lengths"] == mode]
        for column, what in (("speedup_vs_engines", "DeepGEMM+vLLM time / ours_step time"),
                             ("step_over_logits", "ours_step time / ours_logits time")):
            values = [r[column] for r in steps if r.get(column)]
            if values:
                lines.append(f"{what} [{mode}]: geomean {geomean(values):.3f} over {len(values)} shapes "
                             f"({min(values):.3f}-{max(values):.3f})")
    return lines


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m paged_mqa_logits bench --indexer",
                       description="Time the indexer step (paged_mqa_logits.indexer_topk: logits then top-k) against "
                                   "the logits op alone and, with --deepgemm (and --vllm DIR), against DeepGEMM's "
                                   "logits (then vLLM's faster top-k kernel) in the same run (docs/TOPK.md); exits "
                                   "non-zero if a check fails.")
    for name, what in (("heads", "query heads"), ("next_n", "query tokens per sequence"), ("batch", "sequences"),
                       ("context", "the longest context (every one, with uniform lengths)"),
                       ("k", "positions selected per row"), ("kv_block_size", "tokens per KV-cache block")):
        p.add_argument(f"--{name.replace('_', '-')}", default=None,
                       help=f"{what}: default {GPU_DEFAULTS[name]} (CPU: {CPU_DEFAULTS[name]})")
    p.add_argument("--lengths", default=",".join(LENGTHS),
                   help="uniform (every sequence the full context) and/or wide (uniform in [1, context])")
    p.add_argument("--lens-1d", action="store_true", help="1-D context_lens instead of vLLM's 2-D layout")
    p.add_argument("--topk-backend", default=None, choices=BACKENDS,
                   help="the step's top-k backend (default: the tuned tables' pick)")
    p.add_argument("--deepgemm", action="store_true", help="also time DeepGEMM's logits (if deep_gemm imports)")
    p.add_argument("--vllm", default=None,
                   help="with --deepgemm: also DeepGEMM's logits then vLLM's top-k, from a folder staged by "
                        "tools/stage_vllm_topk.sh and built there (bench --topk --help)")
    p.add_argument("--device", default=None, help="cuda / cuda:1 / cpu (default: a GPU if present)")
    p.add_argument("--replays", type=int, default=None, help="graph replays per measurement (default GPU 10, CPU 2)")
    p.add_argument("--copies", type=int, default=None, help="rotating copies (default: past 4x L2, >= 512 MiB)")
    p.add_argument("--max-copies", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="CSV to write (rewritten after every shape)")
    return p


def resolve_shapes(p: ArgumentParser, a, device: torch.device) -> tuple[list[Shape], int]:
    """The shapes (each of the grid's in every length mode) and ``k``; a usage error names the option."""
    values = int_options(p, a, ("heads", "next_n", "batch", "context", "k", "kv_block_size"),
                         CPU_DEFAULTS if device.type == "cpu" else GPU_DEFAULTS)
    modes = a.lengths.split(",")
    if any(m not in LENGTHS for m in modes):
        p.error(f"argument --lengths: expected a comma-separated subset of {', '.join(LENGTHS)}, got {a.lengths!r}")
    if len(values["k"]) != 1 or values["k"][0] > MAX_K:
        p.error(f"argument --k: expected one int in 1..{MAX_K}, got {a.k!r}")
    if a.vllm and not a.deepgemm:
        p.error("argument --vllm: times vLLM's top-k after DeepGEMM's logits; give --deepgemm too")
    grid = grid_shapes(values["heads"], values["next_n"], values["batch"], values["context"], values["kv_block_size"],
                       lens_2d=not a.lens_1d)
    shapes = [dataclasses.replace(shape, ragged=RAGGED[m]) for shape in grid for m in modes]
    for shape in shapes:
        error = shape_error(shape)
        if error:
            p.error(error)
    return shapes, values["k"][0]


def main(argv: list[str]) -> int:
    p = parser()
    a = p.parse_args(argv)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    shapes, k = resolve_shapes(p, a, device)
    vllm = vllm_missing = None
    if a.vllm:
        try:
            vllm = load_vllm(a.vllm)
        except Exception as exc:
            vllm_missing = f"--vllm {a.vllm}: not importable ({type(exc).__name__}: {exc})"
            print(f"note: {vllm_missing}; the deepgemm+vllm rows are skipped", file=sys.stderr)
    env = environment(device)
    header = header_lines(env, "python -m paged_mqa_logits bench --indexer " + " ".join(argv), METHOD,
                          a.vllm if vllm is not None else None)
    for line in header:
        print(line)
    schedule = Schedule(replays=a.replays or (10 if device.type == "cuda" else 2))
    results: list[dict] = []
    for shape in shapes:
        try:
            results.extend(measure_shape(a, shape, k, vllm, vllm_missing, device, env, schedule))
        except DeviceLost as exc:  # nothing more can be measured in this process
            results.append(dict(base_row(shape, k, "ours_logits"), status=str(exc)))
            break
        finally:
            if a.out:
                write_csv(a.out, header, results, COLUMNS)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(",".join(COLUMNS))
    for r in results:
        print(",".join(fmt(r.get(c)) for c in COLUMNS))
    for line in summary(results):
        print("# " + line)
    return 1 if any(r["status"].startswith(("FAIL", "ERROR")) for r in results) else 0
