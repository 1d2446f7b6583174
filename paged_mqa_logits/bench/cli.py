"""``python -m paged_mqa_logits bench``: the grid or shape file, what to time, the method's
settings; prints the table and summary, writes the CSV as it goes."""

from __future__ import annotations

import sys

import torch
from tqdm import tqdm

from .. import backends
from ..cli import ArgumentParser
from ..problem import HEAD_DIM, KV_FORMATS, LOGITS_DTYPES, Problem, Target
from .deepgemm import deepgemm_available
from .environment import environment
from .measure import DeviceLost, Impl, Measurement, Schedule, measure, parse_knobs
from .report import load_anchor, print_table, summary, write_csv
from .shapes import (CPU_GRID as CPU_GRID_VALUES, DEFAULT_GRID, Shape, int_list, grid_shapes, shape_error,
                     shapes_from_csv)
from .indexer import main as indexer_main
from .topk import main as topk_main
from .workload import SKIPPED_FOR_MEMORY, ShapeDoesNotFit, build_workload


def _bool_list(text: str) -> list[bool]:
    return [{"0": False, "1": True, "false": False, "true": True}[x.strip().lower()] for x in text.split(",")]


def _impls(a, shape: Shape, problem: Problem, target: Target) -> list[Impl]:
    out = []
    if a.dispatch or not (a.backend or a.all_candidates):
        out.append(Impl("dispatch"))
    names = a.backend.split(",") if a.backend else []
    if a.all_candidates and not names:
        names = [n for n in backends.names() if backends.why_not(n, problem, target) is None]
    config = parse_knobs(a.config) if a.config else None
    for name in names:
        if a.all_candidates and backends.why_not(name, problem, target) is None:
            # --config narrows the candidates to those with these knob values
            out.extend(Impl.of(name, c) for c in backends.get(name).candidates(problem)
                       if all(str(c.get(k)) == str(v) for k, v in (config or {}).items()))
        else:
            out.append(Impl.of(name, config))
    if a.deepgemm:
        out.append(Impl("deepgemm"))
    return list(dict.fromkeys(out))


#: the grids' defaults as option text, on a GPU and on a CPU
GPU_GRID = {name: ",".join(map(str, values)) for name, values in DEFAULT_GRID.items()}
CPU_GRID = {name: ",".join(map(str, values)) for name, values in CPU_GRID_VALUES.items()}


def describe_grid(a, defaults: list[str], device) -> str:
    """Where the shapes came from: the file, or the grid and which of its axes are defaults."""
    if a.shapes:
        return f"from {a.shapes}"
    axes = (f"heads {a.heads} x next_n {a.next_n} x batch {a.batch} x context {a.context} x kv_block_size "
            f"{a.kv_block_size}")
    if defaults:
        axes += f"; {'CPU' if torch.device(device).type == 'cpu' else 'GPU'} defaults for " + ", ".join(defaults)
    return axes


def _problem_for(shape: Shape, target: Target) -> Problem:
    return Problem.of(shape.shape_key, target, context=shape.context, lens_2d=shape.lens_2d,
                      max_model_len=shape.context)


def parser() -> ArgumentParser:
    """The bench's options (the shared :class:`~paged_mqa_logits.cli.ArgumentParser`: defaults
    in ``--help``, a usage error raised as ``CliError`` naming the option)."""
    p = ArgumentParser(
        prog="python -m paged_mqa_logits bench",
        description="Time backends, knob sets, the production dispatch and (if importable) DeepGEMM in the "
                    "same run with the method of docs/BENCHMARK.md; writes a CSV. A shape whose inputs do not fit "
                    "the free memory (capped by PAGED_MQA_LOGITS_MEMORY_LIMIT bytes) is skipped, not failed. "
                    "With --topk: the top-k bench instead (its own options, --topk --help); with --indexer: the "
                    "indexer step's (--indexer --help).",
        epilog="exit status: 0 every shape that ran passed its check; 1 a shape failed its check or raised; "
               "2 a usage error.")
    g = p.add_argument_group("shapes (a grid, or --shapes FILE); on a CPU the grid's defaults are a small grid")
    g.add_argument("--heads", default=None, help=f"default {GPU_GRID['heads']} (CPU: {CPU_GRID['heads']})")
    g.add_argument("--next-n", default=None, help=f"default {GPU_GRID['next_n']} (CPU: {CPU_GRID['next_n']})")
    g.add_argument("--batch", default=None, help=f"default {GPU_GRID['batch']} (CPU: {CPU_GRID['batch']})")
    g.add_argument("--context", default=None, help=f"default {GPU_GRID['context']} (CPU: {CPU_GRID['context']}; "
                                                   "with --shapes: overrides the file's)")
    g.add_argument("--kv-block-size", default=None,
                   help=f"default {GPU_GRID['kv_block_size']} (CPU: {CPU_GRID['kv_block_size']})")
    g.add_argument("--head-dim", type=int, default=HEAD_DIM)
    g.add_argument("--preshuffle", action="store_true", help="preshuffled cache (see --preshuffle-values for both)")
    g.add_argument("--preshuffle-values", default=None, help="e.g. 0,1 to bench both layouts")
    g.add_argument("--lens-1d", action="store_true", help="1-D context_lens instead of vLLM's 2-D layout")
    g.add_argument("--kv-format", default=None, choices=KV_FORMATS,
                   help="query/key format: fp8, or fp4 (MXFP4: 68 cache bytes a token instead of 132); "
                        "default fp8, or a --shapes file's column")
    g.add_argument("--logits-dtype", default=None, choices=tuple(LOGITS_DTYPES),
                   help="logits dtype (bf16: 2 bytes a logit); default fp32, or a --shapes file's column")
    lengths = g.add_mutually_exclusive_group()
    lengths.add_argument("--ragged", action="store_true", help="per-sequence contexts in [context/2, context]")
    lengths.add_argument("--wide-ragged", action="store_true",
                         help="per-sequence contexts uniform in [1, context], as in serving decode batches")
    g.add_argument("--shapes", default=None,
                   help="CSV of shapes: heads,next_n,batch,context (or contexts) [,kv_block_size,preshuffle,kv_format,"
                        "logits_dtype]")
    i = p.add_argument_group("what to time (default: the production dispatch)")
    i.add_argument("--backend", default=None, help="backend name(s), comma-separated")
    i.add_argument("--config", default=None, help="knobs for --backend, e.g. 'ChunkK=128,SplitKV=0'")
    i.add_argument("--all-candidates", action="store_true",
                   help="every tuner candidate of the backend(s); with --config, those with its knob values")
    i.add_argument("--dispatch", action="store_true", help="also time the production dispatch")
    i.add_argument("--deepgemm", action="store_true",
                   help="also time DeepGEMM on the same inputs (fp8_paged_mqa_logits; fp8_fp4_paged_mqa_logits with "
                        "the logits dtype for bf16 logits or fp4; flattened to next_n 1 where it refuses the next_n, "
                        "as vLLM runs it; fp4 on sm_90 has no DeepGEMM peer and is skipped)")
    i.add_argument("--no-hint", action="store_true", help="call without context_hint (the table's 'any' rows)")
    i.add_argument("--clean-logits", action="store_true",
                   help="calls with clean_logits=True (-inf wherever a row sees nothing); not with --deepgemm")
    m = p.add_argument_group("method")
    m.add_argument("--device", default=None, help="cuda / cuda:1 / cpu (default: a GPU if present)")
    m.add_argument("--replays", type=int, default=None, help="graph replays per measurement (default GPU 10, CPU 3)")
    m.add_argument("--copies", type=int, default=None, help="rotating copies (default: past 4x L2, >= 512 MiB)")
    m.add_argument("--cold-l2", action="store_true",
                   help="GPU: write twice the L2 before every call and time each call alone (its own graph, "
                        "events around its replay), as vendors time kernels; default: graphs cycling over copies")
    m.add_argument("--max-copies", type=int, default=256)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--anchor", default=None,
                   help="DeepGEMM timings from another run (CSV); its ratios are reported as cross-run")
    m.add_argument("--out", default=None, help="CSV to write (default: print only)")
    m.add_argument("--fail-fast", action="store_true")
    m.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--topk" in args:  # the top-k bench has its own options
        return topk_main([x for x in args if x != "--topk"])
    if "--indexer" in args:  # so has the indexer step's
        return indexer_main([x for x in args if x != "--indexer"])
    p = parser()
    a = p.parse_args(argv)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    shapes, defaults = resolve_shapes(p, a, device)
    if a.deepgemm and deepgemm_available():
        print(f"note: --deepgemm: {deepgemm_available()}; DeepGEMM rows are marked skipped", file=sys.stderr)

    env = environment(device)
    target = Target(env.arch, env.cu_num, torch.device(device).type)
    anchor = load_anchor(a.anchor)
    if a.cold_l2 and device.type != "cuda":
        p.error(f"argument --cold-l2: flushes a GPU's L2 between calls; --device is {device}")
    schedule = Schedule(replays=a.replays or (10 if device.type == "cuda" else 3), cold_l2=a.cold_l2)
    command = "python -m paged_mqa_logits bench " + " ".join(argv if argv is not None else sys.argv[1:])
    for line in env.header_lines(command):
        print(line)
    timed = ", ".join(dict.fromkeys(impl.label for shape in shapes
                                    for impl in _impls(a, shape, _problem_for(shape, target), target)))
    print(f"# run: {len(shapes)} shape(s) ({describe_grid(a, defaults, device)}), timing {timed}, "
          f"{schedule.replays} replay(s) per measurement on {device}")
    results, failed = run_shapes(a, shapes, device, env, target, schedule, command, anchor)
    print_table(results, anchor)
    for line in summary(results, anchor):
        print("# " + line)
    if a.out:
        print(f"# wrote {a.out}")
    too_large = len({m.shape for m in results if m.status.startswith(SKIPPED_FOR_MEMORY)})
    if too_large:
        print(f"# skipped {too_large} shape(s) whose inputs do not fit this device's free memory (see status)")
    if failed:
        print("# FAILED: at least one shape failed its accuracy check or raised (see status)", file=sys.stderr)
    return 1 if failed else 0


def resolve_shapes(p: ArgumentParser, a, device) -> tuple[list[Shape], list[str]]:
    """The shapes to time (the grid, its unset axes given the device's defaults, or the file)
    and the grid axes left at their defaults; checks every option first (a usage error names
    the option)."""
    grid = CPU_GRID if device.type == "cpu" else GPU_GRID
    defaults = [] if a.shapes else [name for name in grid if getattr(a, name) is None]
    for name in defaults:
        setattr(a, name, grid[name])
    for option, text in (("--heads", a.heads), ("--next-n", a.next_n), ("--batch", a.batch),
                         ("--context", a.context), ("--kv-block-size", a.kv_block_size)):
        try:
            values = int_list(text) if text is not None else [1]
        except ValueError:
            p.error(f"argument {option}: expected comma-separated positive integers, got {text!r}")
        if not values or min(values) < 1:
            p.error(f"argument {option}: expected comma-separated positive integers, got {text!r}")
    if a.backend:
        unknown = [n for n in a.backend.split(",") if n not in backends.names()]
        if unknown:
            p.error(f"argument --backend: unknown backend(s) {', '.join(unknown)}; known: {', '.join(backends.names())}")
    pre = _bool_list(a.preshuffle_values) if a.preshuffle_values else [a.preshuffle]
    ragged = "wide" if a.wide_ragged else ("half" if a.ragged else "")
    if a.shapes:
        shapes = shapes_from_csv(a.shapes, contexts=int_list(a.context) if a.context else None,
                                 lens_2d=not a.lens_1d, ragged=ragged, kv_format=a.kv_format,
                                 logits_dtype=a.logits_dtype)
    else:
        shapes = grid_shapes(int_list(a.heads), int_list(a.next_n), int_list(a.batch),
                             int_list(a.context), int_list(a.kv_block_size), pre,
                             lens_2d=not a.lens_1d, ragged=ragged, head_dim=a.head_dim,
                             kv_format=a.kv_format or "fp8", logits_dtype=a.logits_dtype or "fp32")
    for shape in shapes:  # the op's own rules, before anything is built: an error names the option
        error = shape_error(shape)
        if error:
            p.error(error)
    if a.config and (not a.backend or "," in a.backend):
        p.error("--config needs exactly one --backend")
    if a.clean_logits and a.deepgemm:
        p.error("--clean-logits times this package's kernels only; drop --deepgemm")
    return shapes, defaults


def run_shapes(a, shapes: list[Shape], device, env, target: Target, schedule: Schedule, command: str,
               anchor) -> tuple[list[Measurement], bool]:
    """Time every shape's implementations in turn (the CSV rewritten after each shape, so a
    later shape that takes the process down keeps what was measured); the measurements, and
    whether any failed."""
    results: list[Measurement] = []
    bar = tqdm(total=len(shapes), unit="shape", disable=a.quiet, file=sys.stderr, dynamic_ncols=True)
    failed = lost = False
    for shape in shapes:
        impls = _impls(a, shape, _problem_for(shape, target), target)
        try:
            workload = build_workload(shape, device, copies=a.copies, max_copies=a.max_copies, seed=a.seed,
                                      context_hint=None if a.no_hint else "context", arch=env.arch)
        except ShapeDoesNotFit as exc:  # the device's size, not a failure: the run goes on
            status = f"{SKIPPED_FOR_MEMORY}{exc}"
            results.extend(Measurement(shape, impl, status=status) for impl in impls)
            tqdm.write(status, file=sys.stderr)
            workload = None
        except Exception as exc:
            status = f"ERROR: building inputs: {type(exc).__name__}: {exc}"[:300]
            results.extend(Measurement(shape, impl, status=status) for impl in impls)
            failed = True
            tqdm.write(f"{status} -- {shape.describe()}", file=sys.stderr)
            workload = None
        for impl in impls if workload is not None else []:
            try:
                m = measure(impl, workload, schedule, copy_gbps=env.copy_gbps, clean_logits=a.clean_logits)
            except DeviceLost as exc:
                m, lost = Measurement(shape, impl, rotate=workload.copies, status=str(exc)), True
            results.append(m)
            failed |= m.failed
            bar.set_postfix_str(f"{impl.label}: " + (f"{m.us:.2f} us" if m.us else m.status)[:40])
            if m.failed:
                tqdm.write(f"{m.status} -- {shape.describe()} {impl.label}", file=sys.stderr)
            if lost:
                break
        del workload
        if device.type == "cuda" and not lost:
            torch.cuda.empty_cache()
        bar.update(1)
        if a.out:  # keep what was measured if a later shape takes the process down
            write_csv(a.out, env, results, command=command, anchor=anchor)
        if lost or (failed and a.fail_fast):
            break
    bar.close()
    return results, failed
