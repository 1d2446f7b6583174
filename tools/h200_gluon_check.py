"""H200 check of the gluon ``mma_v2`` variant: the register-MMA kernel body the AMD MFMA kernels
share, run on CUDA so its index / mask / gather / epilogue code gets numerical coverage.

Argument-free. Prints one table row per case (PASS/FAIL, calc_diff, untouched sentinels) and a
short timing table of the default config on a few shapes (informational: mma_v2 on sm_90 is
f16 HMMA after an fp8 unpack, not the fast Hopper kernel). Writes the same text to
``$OUT/h200_gluon_check.log`` when ``OUT`` is set. Exit status 1 if any case fails.

Cases: every candidate of four shapes (H 32/64, next_n 1/2/4/8, KVBlockSize 1/16/64/128,
Preshuffle on/off, 1-D/2-D lengths); 24 random cases (block sizes 1..256, contexts incl. 0
and odd, padded block strides, strided table and output rows) walking the candidate set; the
forced paths (Q in registers, explicit SplitKV incl. more splits than tiles); a KV cache and
an output past 2^31 bytes; CUDA-graph capture and replay.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from paged_mqa_logits.backends.gluon import hopper_mma  # noqa: E402
from paged_mqa_logits.op import build_launch_args  # noqa: E402
from paged_mqa_logits.reference import check_logits, make_inputs, reference_logits  # noqa: E402

LINES: list[str] = []
FAILED: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    LINES.append(text)


def args_of(inp, hint=None):
    return build_launch_args(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"], inp["context_lens"],
                             inp["kv_indices"], inp["max_model_len"], inp["preshuffle"], inp["kv_block_size"], hint)


def reference(inp):
    return reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                            inp["max_model_len"], kv_block_size=inp["kv_block_size"], preshuffle=inp["preshuffle"])


def describe(inp) -> str:
    q = inp["q_fp8"]
    lens = "2d" if inp["context_lens"].dim() == 2 else "1d"
    return (f"B{q.shape[0]} n{q.shape[1]} H{q.shape[2]} bs{inp['kv_block_size']}{'p' if inp['preshuffle'] else ''} "
            f"{lens} mml{inp['max_model_len']}")


def check_case(label: str, inp: dict, config: dict, ref=None, hint=None) -> None:
    try:
        args = args_of(inp, hint)
        before = inp["out_logits"].clone()
        hopper_mma.launch(args, config)
        torch.cuda.synchronize()
        check = check_logits(inp["out_logits"], before, reference(inp) if ref is None else ref)
        ok, text = check.ok, f"diff={check.calc_diff:.1e} untouched={'yes' if check.untouched else 'NO'}"
    except Exception as exc:  # report and carry on
        ok, text = False, f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    knobs = " ".join(f"{k}={v}" for k, v in sorted(config.items()) if k != "variant")
    row = f"{'PASS' if ok else 'FAIL'}  {label:<10} {describe(inp):<34} {knobs:<60} {text}"
    say(row)
    if not ok:
        FAILED.append(row)


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA GPU")
        return 1
    say(f"gluon mma_v2 check on {torch.cuda.get_device_name()} (torch {torch.__version__})")
    fp8 = torch.float8_e4m3fn
    start = time.time()

    # every candidate of four shapes
    shapes = [(3, 1, 64, [515, 0, 129], 64, True, True), (2, 2, 32, [1000, 77], 16, False, False),
              (2, 4, 64, [700, 33], 128, True, True), (2, 8, 32, [333, 9], 1, False, True)]
    for i, (b, n, h, lens, bs, pre, l2) in enumerate(shapes):
        inp = make_inputs(b, n, h, lens, kv_block_size=bs, preshuffle=pre, lens_2d=l2, device="cuda", fp8_dtype=fp8,
                          seed=i, out_row_pad=3, table_row_pad=2, block_stride_pad=16, max_model_len=max(lens) + 40)
        ref = reference(inp)
        for config in hopper_mma.candidates(args_of(inp).problem):
            inp["out_logits"].fill_(float("nan"))
            check_case("candidate", inp, config, ref)

    # random cases walking the candidate set
    for seed in range(24):
        rng = random.Random(4000 + seed)
        bs = rng.choice((1, 16, 32, 64, 128, 256))
        n = rng.choice((1, 2, 3, 4, 8))
        batch = rng.randint(1, 4)
        lens = [rng.choice((0, 1, rng.randint(1, 900), rng.randint(1, 900) | 1)) for _ in range(batch)]
        lens[0] = max(lens[0], n)
        mml = max(lens) + rng.choice((0, 5, 64)) if rng.random() < 0.8 else max(1, max(lens) // 2)
        inp = make_inputs(batch, n, rng.choice((32, 64)), lens, kv_block_size=bs,
                          preshuffle=bs % 16 == 0 and rng.random() < 0.5, lens_2d=rng.random() < 0.6,
                          max_model_len=mml, device="cuda", fp8_dtype=fp8, seed=seed,
                          block_stride_pad=rng.choice((0, 16, 132)), table_pad=rng.choice((0, 2)),
                          table_row_pad=rng.choice((0, 3)), out_row_pad=rng.choice((0, 2)))
        cands = hopper_mma.candidates(args_of(inp).problem)
        check_case("random", inp, cands[seed % len(cands)])

    # forced paths
    forced = [dict(ChunkK=64, num_warps=4, SplitKV=1, ReuseKV=0, QInLDS=0),
              dict(ChunkK=128, num_warps=8, SplitKV=7, ReuseKV=1, QInLDS=1),
              dict(ChunkK=256, num_warps=8, SplitKV=64, ReuseKV=0, QInLDS=1, Prefetch=0),
              dict(ChunkK=128, num_warps=4, SplitKV=0, ReuseKV=1, QInLDS=0)]
    for i, config in enumerate(forced):
        for h, bs, pre, l2 in ((32, 32, True, True), (64, 64, False, False)):
            inp = make_inputs(3, 3, h, [700, 1, 250], kv_block_size=bs, preshuffle=pre, lens_2d=l2, device="cuda",
                              fp8_dtype=fp8, seed=i, out_row_pad=1, table_pad=1)
            check_case("forced", inp, dict(config, variant="mma_v2"), hint=700 if i == 3 else None)

    # 64-bit offsets: a cache and an output past 2^31 bytes
    inp = make_inputs(2, 2, 64, [64 * 1100, 64 * 1000 + 17], kv_block_size=64, preshuffle=True, device="cuda",
                      fp8_dtype=fp8, seed=7, block_stride_pad=1 << 20)
    check_case("kv>2GiB", inp, hopper_mma.default_config(args_of(inp).problem))
    del inp
    inp = make_inputs(66, 2, 32, [200 + 3 * b for b in range(66)], kv_block_size=32, device="cuda", fp8_dtype=fp8,
                      seed=8)
    inp["out_logits"] = torch.full((133, 4_200_000), float("nan"), device="cuda")
    check_case("out>2GiB", inp, hopper_mma.default_config(args_of(inp).problem))
    del inp
    torch.cuda.empty_cache()

    # CUDA graph
    try:
        inp = make_inputs(4, 2, 64, [900, 5, 64, 333], kv_block_size=64, device="cuda", fp8_dtype=fp8, seed=3)
        args = args_of(inp)
        config = hopper_mma.default_config(args.problem)
        hopper_mma.launch(args, config)
        torch.cuda.synchronize()
        inp["out_logits"].fill_(float("nan"))
        before = inp["out_logits"].clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            hopper_mma.launch(args, config)
        graph.replay()
        torch.cuda.synchronize()
        check = check_logits(inp["out_logits"], before, reference(inp))
        row = f"{'PASS' if check.ok else 'FAIL'}  cuda-graph {describe(inp):<34} {check.describe()}"
    except Exception as exc:
        row = f"FAIL  cuda-graph {type(exc).__name__}: {exc}"
    say(row)
    if row.startswith("FAIL"):
        FAILED.append(row)

    say(f"\n{len(FAILED)} failures; correctness took {time.time() - start:.0f}s")
    if FAILED:
        diagnose_k_width(fp8)
    timing()
    return 1 if FAILED else 0


def diagnose_k_width(fp8) -> None:
    """On failures: the same shapes with 4-byte operand packing (k_width 4, Triton's classic
    mma_v2 fp8 layout) instead of 16, to tell a compiler layout problem from an index bug."""
    say("\ndiagnosis: candidates again with hopper_mma.K_WIDTH = 4")
    saved, saved_failed = hopper_mma.K_WIDTH, list(FAILED)
    hopper_mma.K_WIDTH = 4
    hopper_mma._PLANS.clear()
    try:
        for i, (b, n, h, lens, bs, pre, l2) in enumerate([(3, 1, 64, [515, 0, 129], 64, True, True),
                                                          (2, 4, 32, [700, 33], 16, False, False)]):
            inp = make_inputs(b, n, h, lens, kv_block_size=bs, preshuffle=pre, lens_2d=l2, device="cuda",
                              fp8_dtype=fp8, seed=i)
            for config in hopper_mma.candidates(args_of(inp).problem)[:3]:
                inp["out_logits"].fill_(float("nan"))
                check_case("kwidth4", inp, config)
    finally:
        hopper_mma.K_WIDTH = saved
        hopper_mma._PLANS.clear()
        FAILED[:] = saved_failed


def timing() -> None:
    """Median microseconds of the default config and of the fastest candidate (graph of 20
    calls over rotating copies, ~1 GB of KV in flight), informational."""
    say("\ntiming (us per call, KVBlockSize 64, 2-D lengths, uniform context)")
    say(f"{'H':>3} {'n':>2} {'batch':>5} {'context':>7}  {'default':>9}  {'best':>9}  best config")
    for heads, n, batch, context in ((64, 1, 64, 8192), (64, 2, 64, 8192), (32, 4, 32, 8192), (64, 1, 1, 8192)):
        copies = max(1, min(8, (1 << 30) // (batch * context * 132)))
        inputs = [make_inputs(batch, n, heads, context, kv_block_size=64, device="cuda", seed=i) for i in range(copies)]
        args = [args_of(inp, context) for inp in inputs]
        results = []
        for config in [hopper_mma.default_config(args[0].problem)] + hopper_mma.candidates(args[0].problem):
            try:
                for a in args:
                    hopper_mma.launch(a, config)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for _ in range(20 // copies + 1):
                        for a in args:
                            hopper_mma.launch(a, config)
                calls = (20 // copies + 1) * copies
                times = []
                for _ in range(5):
                    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    t0.record()
                    graph.replay()
                    t1.record()
                    t1.synchronize()
                    times.append(t0.elapsed_time(t1) * 1e3 / calls)
                results.append((statistics.median(times), config))
            except Exception as exc:
                say(f"  timing failed for {config}: {exc}")
        if results:
            best = min(results, key=lambda r: r[0])
            knobs = " ".join(f"{k}={v}" for k, v in sorted(best[1].items()) if k != "variant")
            say(f"{heads:>3} {n:>2} {batch:>5} {context:>7}  {results[0][0]:>9.1f}  {best[0]:>9.1f}  {knobs}")
        del inputs, args
        torch.cuda.empty_cache()


if __name__ == "__main__":
    code = main()
    out_dir = os.environ.get("OUT")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "h200_gluon_check.log"), "w") as f:
            f.write("\n".join(LINES) + "\n")
    sys.exit(code)
