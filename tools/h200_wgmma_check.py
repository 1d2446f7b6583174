"""H200 check of the gluon ``wgmma`` kernel (backends/gluon/hopper_wgmma.py); argument-free.

Part 1, correctness, against ``reference.reference_logits``, calling the variant's ``launch``
directly (so it does not depend on the backend's aggregation or the tuned table):

* a compact matrix covering every block size (1, 16, 32, 64, 128, 256), Preshuffle on/off,
  H 32/64, next_n 1, 2, 3, 4, 5, 7, 8, 1-D and 2-D lengths, random contexts (0, 1, odd, longer
  than max_model_len, longer than the block table), padded/unaligned cache block strides,
  strided q / weights / lengths / block table / output rows; each case runs the default config,
  every other case also a rotating candidate, so every candidate knob value runs somewhere;
* a KV cache larger than 2^31 bytes (the sequence's blocks above the 2 GiB boundary) and an
  output larger than 2^31 bytes (rows starting past 2 GiB), plain and preshuffled;
* CUDA-graph capture (replay == eager, bit for bit) and no host sync after warm-up
  (``torch.cuda.set_sync_debug_mode("error")``).

One line per case: PASS/FAIL, calc_diff on valid positions, ``outside`` (elements written that
the row must not see, or outside the rows) and ``unwritten`` (visible positions left untouched).

Part 2, timing: every candidate (plus the default) on 8 shapes of the benchmark grid with the
method of docs/BENCHMARK.md (``bench.build_workload``: a distinct block per token from a random
permutation, rotating copies past L2; ``bench.time_calls``: CUDA-graph replay), accuracy
checked on each. Prints us, fraction of the copy bandwidth measured in this run, TFLOP/s and the
speed-up over the DeepGEMM anchor; the best candidate per shape and the geomean are summarised.

Kernels are compiled up front in parallel worker processes (best effort: on any problem the JIT
compiles them one by one). With ``$OUT`` set, writes ``wgmma_correctness.csv`` and
``wgmma_timing.csv`` there. Budget: < 4 minutes on one H200.
"""

from __future__ import annotations

import csv
import math
import os
import random
import statistics
import sys
import time
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from paged_mqa_logits import bench  # noqa: E402
from paged_mqa_logits.backends.gluon import hopper_wgmma as wg  # noqa: E402
from paged_mqa_logits.op import build_launch_args  # noqa: E402
from paged_mqa_logits.reference import calc_diff, make_inputs, reference_logits  # noqa: E402

OUT = os.environ.get("OUT")
T_START = time.time()
HEAD_DIM = 128
DEVICE = "cuda"  # the harness itself also runs on CPU tensors (tests of the script), the kernel only on CUDA

# (H, next_n, 2-D lengths), cycled over the (block size, preshuffle) combinations
SHAPE_CYCLE = [(32, 1, True), (64, 2, False), (32, 3, True), (64, 4, True), (32, 8, False), (64, 8, True),
               (64, 1, False), (32, 4, False), (64, 3, True), (32, 2, True), (64, 5, True), (32, 7, False)]
TIMING_SHAPES = [  # (H, next_n, batch, context)
    (64, 1, 1, 8192), (64, 1, 32, 8192), (64, 1, 256, 32768), (64, 2, 64, 32768),
    (64, 4, 64, 8192), (64, 4, 256, 32768), (32, 1, 128, 32768), (32, 4, 32, 32768),
]


def elapsed() -> str:
    return f"[{time.time() - T_START:6.1f}s]"


# ============================================================================ inputs
def strided_case(rng: random.Random, case_id: int, bs: int, pre: bool, heads: int, next_n: int, lens_2d: bool):
    """Random contexts and every stride the contract allows; returns (inputs, description)."""
    batch = rng.randint(2, 4)
    top = rng.choice((200, 700, 1500))
    lens = [rng.choice((0, 1, next_n, rng.randint(1, top) | 1, rng.randint(1, top))) for _ in range(batch)]
    lens[0] = max(lens[0], top)  # one long sequence, several tiles
    mode = case_id % 4
    mml = max(lens) + 37 if mode != 1 else max(1, max(lens) * 2 // 3)  # 1: max_model_len clamps
    stride_pad = rng.choice((0, 4, 16, 132))  # 4 and 132: block strides not 16-byte aligned
    inp = make_inputs(batch, next_n, heads, lens, kv_block_size=bs, preshuffle=pre, lens_2d=lens_2d,
                      max_model_len=mml, device=DEVICE, seed=case_id, block_stride_pad=stride_pad,
                      table_pad=rng.choice((0, 2)), table_row_pad=rng.choice((0, 3)),
                      out_row_pad=rng.choice((0, 2)))
    if mode == 2:  # a block table narrower than the longest sequence: positions past it are never written
        width = max(1, math.ceil(lens[0] / bs) - rng.randint(1, 3))
        inp["kv_indices"] = inp["kv_indices"][:, :width]
    # q, weights and 2-D lengths as strided views of larger buffers
    q = inp["q_fp8"]
    qbuf = torch.zeros(batch, next_n, heads + 16, HEAD_DIM, dtype=torch.uint8, device=DEVICE).view(q.dtype)
    qbuf[:, :, 3:3 + heads] = q
    inp["q_fp8"] = qbuf[:, :, 3:3 + heads]
    w = inp["weights"]
    wbuf = torch.zeros(w.shape[0], heads + 5, device=DEVICE)
    wbuf[:, :heads] = w
    inp["weights"] = wbuf[:, :heads]
    lens_t = inp["context_lens"]
    if lens_t.dim() == 2:
        lbuf = torch.zeros(batch, next_n + 2, dtype=torch.int32, device=DEVICE)
        lbuf[:, :next_n] = lens_t
        inp["context_lens"] = lbuf[:, :next_n]
    text = (f"bs={bs:<3} pre={int(pre)} H={heads} n={next_n} {'2d' if lens_2d else '1d'} lens={lens} mml={mml} "
            f"pad={stride_pad} table={inp['kv_indices'].shape[1]}")
    return inp, text


def embed_high(inp: dict) -> dict:
    """The same problem with every block moved above the 2 GiB boundary of a larger cache."""
    kv = inp["kv_cache"]
    stride0 = kv.stride(0)
    base = (1 << 31) // stride0 + 7
    flat = kv.as_strided((kv.shape[0], stride0), (stride0, 1))
    big = torch.zeros(base + kv.shape[0], stride0, dtype=torch.uint8, device=DEVICE)
    big[base:] = flat
    out = dict(inp)
    out["kv_cache"] = big.as_strided((big.shape[0],) + tuple(kv.shape[1:]), kv.stride())
    table = inp["kv_indices"]
    out["kv_indices"] = torch.where(table >= 0, table + base, table)
    return out


def huge_output(inp: dict) -> dict:
    """The same problem writing into an output whose last rows start past 2^31 bytes."""
    rows = inp["q_fp8"].shape[0] * inp["q_fp8"].shape[1]
    width = inp["max_model_len"] + 8
    stride = max(width, (1 << 31) // (4 * (rows - 1)) + 1024)
    buf = torch.full((rows, stride), float("nan"), device=DEVICE)
    out = dict(inp)
    out["out_logits"] = buf[:, :width]
    return out


def launch_args(inp: dict):
    return build_launch_args(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"], inp["context_lens"],
                             inp["kv_indices"], inp["max_model_len"], inp["preshuffle"], inp["kv_block_size"])


def compare(args, before: torch.Tensor) -> tuple[float, int, int]:
    """(calc_diff on valid positions, elements written outside them, valid positions unwritten)."""
    ref = reference_logits(args.q, args.kv_cache, args.weights, args.context_lens, args.block_table,
                           args.max_model_len, kv_block_size=args.kv_block_size, preshuffle=args.preshuffle)
    rows, width = ref.shape
    valid = torch.zeros(args.out.shape, dtype=torch.bool, device=args.out.device)
    valid[:rows, :width] = torch.isfinite(ref)
    changed = args.out.view(torch.int32) != before.view(torch.int32)
    outside = int((changed & ~valid).sum())
    got = args.out[:rows, :width][valid[:rows, :width]]
    unwritten = int((~changed & valid).sum())  # ``before`` holds a sentinel no kernel computes
    diff = calc_diff(got, ref[valid[:rows, :width]]) if got.numel() else 0.0
    if got.numel() and bool(torch.isnan(got).any()):
        diff = float("inf")
    return diff, outside, unwritten


# ============================================================================ parallel precompile
def _compile_worker(job):
    signature, constexprs, attrs, options, target = job
    import triton

    from paged_mqa_logits.triton_internals.compiler import GluonASTSource
    from paged_mqa_logits.backends.gluon.hopper_wgmma import wgmma_logits_kernel

    t0 = time.time()
    triton.compile(GluonASTSource(wgmma_logits_kernel, signature, constexprs, attrs), target=target, options=options)
    return time.time() - t0


def precompile(pairs) -> None:
    """Fill Triton's cache with the kernels ``launch(args, cfg)`` will JIT, compiled in parallel
    (the specialisation is recorded by Triton's own binder on meta copies of the arguments)."""
    try:
        import concurrent.futures
        import multiprocessing

        from paged_mqa_logits import kernel_cache

        target = kernel_cache.current_target()
        jobs, seen = [], set()
        for args, cfg in pairs:
            sink = []
            with kernel_cache.record_launches(target, sink):
                wg.launch(kernel_cache.meta_launch_args(args), cfg)
            for rec in sink:
                if rec.jit_key not in seen:
                    seen.add(rec.jit_key)
                    jobs.append((rec.signature, rec.constexprs, rec.attrs, dict(rec.options.__dict__), target))
        workers = max(1, min(len(jobs), (os.cpu_count() or 2) - 1, 24))
        t0 = time.time()
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            secs = list(pool.map(_compile_worker, jobs))
        print(f"{elapsed()} precompiled {len(jobs)} kernels on {workers} processes in {time.time() - t0:.1f}s "
              f"(sum {sum(secs):.0f}s)", flush=True)
    except Exception as exc:  # the JIT will compile on first use instead
        print(f"{elapsed()} precompile skipped ({type(exc).__name__}: {str(exc)[:200]})", flush=True)


# ============================================================================ part 1
def correctness_cases() -> list[tuple[str, dict, dict]]:
    """(description, inputs, config) of every correctness case."""
    cases, k = [], 0
    for bs in (1, 16, 32, 64, 128, 256):
        for pre in ((False, True) if bs % 16 == 0 else (False,)):
            for _ in range(4):
                heads, next_n, lens_2d = SHAPE_CYCLE[k % len(SHAPE_CYCLE)]
                rng = random.Random(1000 + k)
                inp, text = strided_case(rng, k, bs, pre, heads, next_n, lens_2d)
                problem = launch_args(inp).problem
                configs = [wg.default_config(problem)]
                cands = wg.candidates(problem)
                if k % 2 == 1 and cands and cands[(k // 2) % len(cands)] != configs[0]:
                    configs.append(cands[(k // 2) % len(cands)])
                for cfg in configs:
                    cases.append((text, inp, cfg))
                k += 1
    # 64-bit offsets: cache > 2 GiB (blocks above the boundary), output > 2 GiB
    for bs, pre in ((64, False), (16, True)):
        inp = make_inputs(2, 2, 64, [700, 333], kv_block_size=bs, preshuffle=pre, device=DEVICE, seed=77)
        cfg = wg.default_config(launch_args(inp).problem)
        cases.append((f"bs={bs:<3} pre={int(pre)} H=64 n=2 2d KV cache > 2^31 bytes", embed_high(inp), cfg))
        cases.append((f"bs={bs:<3} pre={int(pre)} H=64 n=2 2d output > 2^31 bytes", huge_output(inp), cfg))
    return cases


def correctness(cases) -> tuple[list[dict], int]:
    print(f"{elapsed()} == correctness (launch = hopper_wgmma.launch; [ChunkK RowsPerMMA num_stages])", flush=True)
    rows, failures = [], 0
    for text, inp, cfg in cases:
        label = f"[C{cfg['ChunkK']} R{cfg['RowsPerMMA']} S{cfg['num_stages']}" + (
            f" split{cfg['SplitKV']}]" if cfg.get("SplitKV") else "]")
        try:
            args = launch_args(inp)
            args.out.view(torch.int32).fill_(bench.SENTINEL_BITS)  # cases share inputs: start from the sentinel
            before = args.out.clone()
            wg.launch(args, cfg)
            torch.cuda.synchronize()
            diff, outside, unwritten = compare(args, before)
            ok = diff < 1e-3 and outside == 0 and unwritten == 0
            status = "PASS" if ok else "FAIL"
        except Exception as exc:
            diff, outside, unwritten, ok, status = float("nan"), -1, -1, False, f"ERROR {type(exc).__name__}: {exc}"
            traceback.print_exc()
        failures += not ok
        print(f"{status[:4]} {text} {label} calc_diff={diff:.2e} outside={outside} unwritten={unwritten}"
              + ("" if status in ("PASS", "FAIL") else f" {status[:200]}"), flush=True)
        rows.append(dict(case=text, config=bench.format_knobs(cfg), status=status, calc_diff=diff, outside=outside,
                         unwritten=unwritten))
    failures += graph_and_sync_checks(rows)
    return rows, failures


def graph_and_sync_checks(rows: list[dict]) -> int:
    """Replay == eager bit for bit; no host sync in a warm launch."""
    failures = 0
    for heads, next_n, bs, pre in ((64, 4, 64, False), (32, 3, 16, True)):
        inp = make_inputs(3, next_n, heads, [900, 0, 511], kv_block_size=bs, preshuffle=pre, device=DEVICE, seed=5)
        args = launch_args(inp)
        cfg = wg.default_config(args.problem)
        text = f"bs={bs:<3} pre={int(pre)} H={heads} n={next_n} graph replay == eager, no host sync"
        try:
            wg.launch(args, cfg)  # warm-up: compile outside capture
            torch.cuda.synchronize()
            eager = args.out.clone()
            torch.cuda.set_sync_debug_mode("error")
            try:
                wg.launch(args, cfg)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                wg.launch(args, cfg)
            args.out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            same = torch.equal(args.out.view(torch.int32), eager.view(torch.int32))
            status = "PASS" if same else "FAIL"
        except Exception as exc:
            status = f"ERROR {type(exc).__name__}: {str(exc)[:200]}"
        failures += status != "PASS"
        print(f"{status[:4]} {text}" + ("" if status in ("PASS", "FAIL") else f" {status}"), flush=True)
        rows.append(dict(case=text, config=bench.format_knobs(cfg), status=status, calc_diff="", outside="",
                         unwritten=""))
    return failures


# ============================================================================ part 2
def timing_configs(problem) -> list[dict]:
    configs = wg.candidates(problem)
    default = wg.default_config(problem)
    return configs + ([default] if default not in configs else [])


def timing_standins() -> list[tuple[object, dict]]:
    """(args, config) pairs that JIT exactly the kernels the timing part launches: batch-1
    inputs of each timing shape specialise like the full ones (same strides and alignment),
    with the configs chosen for the full problem."""
    import dataclasses

    pairs = []
    for heads, next_n, batch, context in TIMING_SHAPES:
        small = launch_args(make_inputs(1, next_n, heads, [context], kv_block_size=64, device=DEVICE, seed=0))
        full = dataclasses.replace(small.problem, batch=batch, context=context)
        pairs += [(small, cfg) for cfg in timing_configs(full)]
    return pairs


def timing(copy_gbps: float) -> list[dict]:
    print(f"{elapsed()} == timing (copy bandwidth {copy_gbps / 1e3:.2f} TB/s; graph replay over rotating copies)",
          flush=True)
    anchor = bench.load_anchor()
    rows, best = [], {}
    schedule = bench.Schedule(replays=7, min_replay_us=1500.0)
    for heads, next_n, batch, context in TIMING_SHAPES:
        shape = bench.Shape(heads, next_n, batch, context)
        w = bench.build_workload(shape, "cuda")
        problem = w.args[0].problem
        default = wg.default_config(problem)
        ref_us = bench.anchor_us(anchor, shape)
        print(f"{elapsed()} {shape.describe()} copies={w.copies} anchor={ref_us}us", flush=True)
        for cfg in timing_configs(problem):
            calls = [lambda a=a, c=cfg: wg.launch(a, c) for a in w.args]
            row = dict(H=shape.heads, next_n=shape.next_n, batch=shape.batch, context=shape.context,
                       ChunkK=cfg["ChunkK"], RowsPerMMA=cfg["RowsPerMMA"], num_stages=cfg["num_stages"],
                       SplitKV=cfg["SplitKV"], splits=wg.num_splits(problem, cfg), default=int(cfg == default),
                       us="", frac_bw="", TFLOPs="", calc_diff="", mask_ok="", timing="", spread="", vs_deepgemm="")
            try:
                diff, mask_ok = bench.check(bench.Impl.of("gluon", cfg), w, calls[0])
                t = bench.time_calls(calls, w.device, schedule)
                gbps = w.accounting.bytes / t.us / 1e3
                row.update(us=round(t.us, 2), frac_bw=round(gbps / copy_gbps, 3),
                           TFLOPs=round(w.accounting.flops(shape.heads, shape.head_dim) / t.us / 1e6, 1),
                           calc_diff=f"{diff:.2e}", mask_ok=int(bool(mask_ok)), timing=t.method,
                           spread=round(t.spread, 3), vs_deepgemm=round(ref_us / t.us, 3) if ref_us else "")
                status = "ok" if diff < 1e-3 and mask_ok and t.method == "graph" else "FAIL"
            except Exception as exc:
                status = f"ERROR {type(exc).__name__}: {str(exc)[:160]}"
            row["status"] = status
            rows.append(row)
            print(f"    C{cfg['ChunkK']:<3} R{cfg['RowsPerMMA']} S{cfg['num_stages']} split={row['splits']:<4}"
                  f"{'*' if row['default'] else ' '} {row['us']!s:>8} us {row['frac_bw']!s:>6} bw "
                  f"{row['TFLOPs']!s:>7} TF/s x{row['vs_deepgemm']!s:<6} diff={row['calc_diff']} {status}", flush=True)
            if status == "ok" and (shape not in best or row["us"] < best[shape]["us"]):
                best[shape] = row
        del w
        torch.cuda.empty_cache()
    print(f"{elapsed()} == best candidate per shape")
    ratios, default_ratios = [], []
    for shape, row in best.items():
        print(f"    {shape.describe():<62} {row['us']:>8} us x{row['vs_deepgemm']} "
              f"C{row['ChunkK']} R{row['RowsPerMMA']} S{row['num_stages']} split={row['splits']}")
        if row["vs_deepgemm"]:
            ratios.append(row["vs_deepgemm"])
    default_ratios = [r["vs_deepgemm"] for r in rows if r["default"] and r["status"] == "ok" and r["vs_deepgemm"]]
    if ratios:
        print(f"    geomean vs DeepGEMM over these shapes: best {math.exp(statistics.fmean(map(math.log, ratios))):.3f}"
              + (f", default config {math.exp(statistics.fmean(map(math.log, default_ratios))):.3f}"
                 if default_ratios else ""))
    return rows


def write_csv(name: str, rows: list[dict]) -> None:
    if OUT and rows:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with open(os.path.join(OUT, name), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)


def main() -> int:
    import triton

    props = torch.cuda.get_device_properties(0)
    print(f"{props.name} SMs={props.multi_processor_count} torch {torch.__version__} triton {triton.__version__}",
          flush=True)
    cases = correctness_cases()
    precompile([(launch_args(inp), cfg) for _, inp, cfg in cases] + timing_standins())
    correctness_rows, failures = correctness(cases)
    del cases
    torch.cuda.empty_cache()
    write_csv("wgmma_correctness.csv", correctness_rows)
    print(f"{elapsed()} correctness: {len(correctness_rows) - failures}/{len(correctness_rows)} passed", flush=True)
    copy_gbps = bench.copy_bandwidth("cuda")
    timing_rows = timing(copy_gbps)
    write_csv("wgmma_timing.csv", timing_rows)
    print(f"{elapsed()} done", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
