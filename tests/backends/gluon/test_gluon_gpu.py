"""Numerical correctness of the gluon variants on a GPU, against ``reference.reference_logits``.

* CUDA sm_90 (H200): the ``mma_v2`` variant -- the kernel body the AMD variant runs, so this is
  where the AMD path's index, mask, gather and epilogue code is executed -- and ``wgmma``, its
  warp-specialised twin ``wgmma_ws`` and the consumer-team kernel ``wgmma_pipes`` when importable;
* ROCm gfx942 / gfx950: the ``mfma`` variant.

Skipped (with the reason printed) without a GPU or on another arch. Every check is the
contract's (docs/CONTRACT.md): positions a row does not see keep their sentinel bit pattern (NaN fill, padded rows
and columns around the written region), ``calc_diff < 1e-3`` on the visible positions.

Matrix: KVBlockSize 1/16/32/64/128/256, Preshuffle on/off, H 32/64, next_n 1/2/3/4/8, 1-D and
2-D lengths, random per-sequence contexts including 0 and odd lengths, padded block strides,
strided block-table and output rows (``op_cases.random_case``); every candidate of three
shapes; forced split counts and the register/LDS query paths; 1-D vs 2-D bit identity; a KV
cache and an output past 2^31 bytes (64-bit offsets, and AMD's 64-bit gather path); CUDA-graph
capture and replay (bit-identical to the eager call, no host sync in a warm launch); strided
q / weights / 2-D lengths, block tables narrower than the longest sequence, block strides not
16-byte aligned and next_n 5 / 7 (uneven wgmma row groups).
"""

from __future__ import annotations

import pytest
import torch

from op_cases import build, random_case
from paged_mqa_logits.op import build_launch_args
from paged_mqa_logits.reference import check_logits, make_inputs, reference_logits

pytestmark = pytest.mark.gpu

VARIANTS = {"sm_90": ("mma_v2", "wgmma", "wgmma_ws", "wgmma_pipes"), "gfx942": ("mfma",), "gfx950": ("mfma",)}
ALL_VARIANTS = ("mma_v2", "wgmma", "wgmma_ws", "wgmma_pipes", "mfma")


def _skip(reason: str):
    print(f"\nSKIP: {reason}")
    pytest.skip(reason)


def device_arch() -> str:
    if not torch.cuda.is_available():
        _skip("no CUDA/ROCm GPU: the gluon kernels only run on one")
    from paged_mqa_logits.arch import detect

    return detect("cuda").arch


def fp8_dtype(arch: str):
    return torch.float8_e4m3fnuz if arch == "gfx942" else torch.float8_e4m3fn


def variant_module(name: str):
    """The variant object named ``name`` (skips when it does not target this GPU; a variant that
    does not import fails the backend's import, not a skip)."""
    arch = device_arch()
    if name not in VARIANTS.get(arch, ()):
        _skip(f"variant {name!r} does not target this GPU ({arch})")
    from paged_mqa_logits.backends.gluon import variants

    found = [v for v in variants() if v.name == name]
    assert found, f"no gluon variant named {name!r}"
    return found[0]


def launch_args(inp: dict, context_hint=None):
    return build_launch_args(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"], inp["context_lens"],
                             inp["kv_indices"], inp["max_model_len"], inp["preshuffle"], inp["kv_block_size"],
                             context_hint)


def run_checked(module, inp: dict, config: dict | None = None, reference=None):
    """Launch ``module`` on ``inp`` (config: the module default) and compare with the reference."""
    args = launch_args(inp, context_hint=int(inp["context_lens"].max()) if config and config.get("hint") else None)
    reason = module.unsupported(args.problem)
    assert reason is None, reason
    config = dict(module.default_config(args.problem) if config is None else config)
    config.pop("hint", None)
    before = inp["out_logits"].clone()
    module.launch(args, config)
    torch.cuda.synchronize()
    ref = reference if reference is not None else reference_logits(
        inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"], inp["max_model_len"],
        kv_block_size=inp["kv_block_size"], preshuffle=inp["preshuffle"])
    return check_logits(inp["out_logits"], before, ref), config


@pytest.mark.parametrize("name", ALL_VARIANTS)
@pytest.mark.parametrize("seed", range(24))
def test_random_matrix(name, seed):
    module = variant_module(name)
    arch = device_arch()
    case = random_case(9000 + seed, heads=(32, 64), max_context=700, max_batch=4)
    inp = build(case, device="cuda", fp8_dtype=fp8_dtype(arch))
    problem = launch_args(inp).problem
    cands = module.candidates(problem)
    config = cands[seed % len(cands)]  # walk the candidate set across seeds
    check, config = run_checked(module, inp, config)
    assert check.ok, f"{case} {config}: {check.describe()}"


SHAPES = (
    dict(batch=3, next_n=1, heads=64, context_lens=[515, 0, 129], kv_block_size=64, preshuffle=True),
    dict(batch=2, next_n=4, heads=32, context_lens=[1000, 77], kv_block_size=16, preshuffle=False, lens_2d=False),
    dict(batch=2, next_n=8, heads=64, context_lens=[333, 9], kv_block_size=1, preshuffle=False),
    dict(batch=2, next_n=4, heads=64, context_lens=[700, 33], kv_block_size=128, preshuffle=True),
)


@pytest.mark.parametrize("name", ALL_VARIANTS)
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_every_candidate(name, shape):
    module = variant_module(name)
    arch = device_arch()
    spec = dict(SHAPES[shape])
    batch, next_n, heads, lens = spec.pop("batch"), spec.pop("next_n"), spec.pop("heads"), spec.pop("context_lens")
    inp = make_inputs(batch, next_n, heads, lens, device="cuda", fp8_dtype=fp8_dtype(arch), seed=shape, out_row_pad=3,
                      table_row_pad=2, block_stride_pad=16, max_model_len=max(lens) + 40, **spec)
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                           inp["max_model_len"], kv_block_size=inp["kv_block_size"], preshuffle=inp["preshuffle"])
    failures = []
    for config in module.candidates(launch_args(inp).problem):
        inp["out_logits"].fill_(float("nan"))
        check, _ = run_checked(module, inp, config, reference=ref)
        if not check.ok:
            failures.append(f"{config}: {check.describe()}")
    assert not failures, "\n".join(failures)


FORCED = {
    "mma_v2": [dict(ChunkK=64, num_warps=4, SplitKV=1, ReuseKV=0, QInLDS=0),  # Q in registers (AMD per-row path)
               dict(ChunkK=128, num_warps=8, SplitKV=7, ReuseKV=1, QInLDS=1),
               dict(ChunkK=256, num_warps=8, SplitKV=64, ReuseKV=0, QInLDS=1, Prefetch=0),  # > tiles splits
               dict(ChunkK=128, num_warps=4, SplitKV=0, ReuseKV=1, QInLDS=0, hint=True)],
    "mfma": [dict(ChunkK=64, WavePerEU=4, SplitKV=1, ReuseKV=0, QInLDS=0),
             dict(ChunkK=128, WavePerEU=2, SplitKV=7, ReuseKV=1, QInLDS=1),
             dict(ChunkK=256, WavePerEU=4, SplitKV=64, ReuseKV=0, QInLDS=1, Prefetch=0),
             dict(ChunkK=128, WavePerEU=1, SplitKV=0, ReuseKV=1, QInLDS=0, hint=True)],
}


@pytest.mark.parametrize("name", ("mma_v2", "mfma"))
@pytest.mark.parametrize("index", range(4))
def test_forced_paths(name, index):
    module = variant_module(name)
    arch = device_arch()
    config = dict(FORCED[name][index], variant=name)
    for heads, kv_block_size, pre, lens_2d in ((32, 32, True, True), (64, 64, False, False)):
        inp = make_inputs(3, 3, heads, [700, 1, 250], kv_block_size=kv_block_size, preshuffle=pre, lens_2d=lens_2d,
                          device="cuda", fp8_dtype=fp8_dtype(arch), seed=index, out_row_pad=1, table_pad=1)
        check, _ = run_checked(module, inp, config)
        assert check.ok, f"{config} heads={heads}: {check.describe()}"


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_1d_and_2d_lengths_are_bit_identical(name):
    module = variant_module(name)
    arch = device_arch()
    outs = []
    for lens_2d in (False, True):
        inp = make_inputs(3, 4, 64, [300, 3, 129], kv_block_size=16, preshuffle=True, lens_2d=lens_2d, device="cuda",
                          fp8_dtype=fp8_dtype(arch), seed=5)
        check, _ = run_checked(module, inp)
        assert check.ok, check.describe()
        outs.append(inp["out_logits"])
    assert torch.equal(outs[0].view(torch.int32), outs[1].view(torch.int32))


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_kv_cache_past_2gib(name):
    """Blocks padded to 1 MiB: the last blocks start past 2^31 bytes (64-bit gathers; on AMD the
    host switches the cache loads from 32-bit buffer offsets to 64-bit global loads)."""
    module = variant_module(name)
    arch = device_arch()
    inp = make_inputs(2, 2, 64, [64 * 1100, 64 * 1000 + 17], kv_block_size=64, preshuffle=True, device="cuda",
                      fp8_dtype=fp8_dtype(arch), seed=7, block_stride_pad=(1 << 20))
    kv = inp["kv_cache"]
    assert kv.shape[0] * kv.stride(0) > 2**31
    check, _ = run_checked(module, inp)
    assert check.ok, check.describe()


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_output_past_2gib(name):
    """A 4.2M-column output row stride: rows 128+ start past 2^31 bytes (64-bit row offsets)."""
    module = variant_module(name)
    arch = device_arch()
    batch, next_n = 66, 2
    inp = make_inputs(batch, next_n, 32, [200 + 3 * b for b in range(batch)], kv_block_size=32, device="cuda",
                      fp8_dtype=fp8_dtype(arch), seed=8)
    width = 4_200_000
    big = torch.full((batch * next_n + 1, width), float("nan"), device="cuda")
    assert big.numel() * 4 > 2**31 and (batch * next_n - 1) * width * 4 > 2**31
    inp["out_logits"] = big
    check, _ = run_checked(module, inp)
    assert check.ok, check.describe()


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_cuda_graph_capture_and_replay(name):
    module = variant_module(name)
    arch = device_arch()
    inp = make_inputs(4, 2, 64, [900, 5, 64, 333], kv_block_size=64, device="cuda", fp8_dtype=fp8_dtype(arch), seed=3)
    args = launch_args(inp)
    config = module.default_config(args.problem)
    module.launch(args, config)  # warm-up: compile outside the capture
    torch.cuda.synchronize()
    inp["out_logits"].fill_(float("nan"))
    before = inp["out_logits"].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        module.launch(args, config)
    graph.replay()
    torch.cuda.synchronize()
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                           inp["max_model_len"], kv_block_size=64, preshuffle=False)
    check = check_logits(inp["out_logits"], before, ref)
    assert check.ok, check.describe()


#: (heads, next_n, kv_block_size, preshuffle, 2-D lengths, block stride pad, what else is odd)
STRIDED = (
    (64, 5, 64, True, True, 4, "narrow table"),  # pad 4: cache blocks not 16-byte aligned
    (32, 7, 16, False, False, 132, "max_model_len clamps"),
    (64, 3, 1, False, True, 0, "narrow table"),
    (32, 2, 256, True, True, 16, ""),
)


def strided_inputs(index: int, arch: str) -> dict:
    """``STRIDED[index]``: one long sequence among empty, single-token and odd ones, with q, the
    weights and 2-D lengths as strided views of larger buffers, optionally a block table
    narrower than the longest sequence (positions past it are never written) or a
    ``max_model_len`` below it."""
    heads, next_n, kv_block_size, pre, lens_2d, pad, odd = STRIDED[index]
    lens = [1500, 0, 1, 333, next_n]
    mml = 1000 if odd == "max_model_len clamps" else max(lens) + 37
    inp = make_inputs(len(lens), next_n, heads, lens, kv_block_size=kv_block_size, preshuffle=pre, lens_2d=lens_2d,
                      max_model_len=mml, device="cuda", fp8_dtype=fp8_dtype(arch), seed=20 + index,
                      block_stride_pad=pad, table_pad=index % 2, table_row_pad=3, out_row_pad=2)
    if odd == "narrow table":
        inp["kv_indices"] = inp["kv_indices"][:, :-(-lens[0] // kv_block_size) - 2]
    batch, dim = len(lens), inp["q_fp8"].shape[-1]
    q = inp["q_fp8"]
    qbuf = torch.zeros(batch, next_n, heads + 16, dim, dtype=torch.uint8, device="cuda").view(q.dtype)
    qbuf[:, :, 3:3 + heads] = q
    inp["q_fp8"] = qbuf[:, :, 3:3 + heads]
    w = inp["weights"]
    wbuf = torch.zeros(w.shape[0], heads + 5, device="cuda")
    wbuf[:, :heads] = w
    inp["weights"] = wbuf[:, :heads]
    if lens_2d:
        lbuf = torch.zeros(batch, next_n + 2, dtype=torch.int32, device="cuda")
        lbuf[:, :next_n] = inp["context_lens"]
        inp["context_lens"] = lbuf[:, :next_n]
    return inp


@pytest.mark.parametrize("name", ALL_VARIANTS)
@pytest.mark.parametrize("index", range(len(STRIDED)))
def test_strided_operands_narrow_tables_and_uneven_row_groups(name, index):
    """The default config and one candidate (rotating with the case) on each ``STRIDED`` case."""
    module = variant_module(name)
    inp = strided_inputs(index, device_arch())
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                           inp["max_model_len"], kv_block_size=inp["kv_block_size"], preshuffle=inp["preshuffle"])
    problem = launch_args(inp).problem
    if module.unsupported(problem) is not None:  # e.g. wgmma_ws at next_n 7: more than two row groups
        pytest.skip(f"{module.name}: {module.unsupported(problem)}")
    cands = module.candidates(problem)
    configs = [module.default_config(problem)] + cands[index % len(cands):][:1]
    failures = []
    for config in configs:
        inp["out_logits"].fill_(float("nan"))
        check, _ = run_checked(module, inp, config, reference=ref)
        if not check.ok:
            failures.append(f"{STRIDED[index]} {config}: {check.describe()}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", ALL_VARIANTS)
@pytest.mark.parametrize("heads,next_n,kv_block_size,preshuffle", [(64, 4, 64, False), (32, 3, 16, True)])
def test_graph_replay_is_bit_identical_to_eager_and_never_syncs(name, heads, next_n, kv_block_size, preshuffle):
    """After a warm-up call, a launch makes no host sync (``set_sync_debug_mode("error")``),
    and a captured graph's replay writes exactly the eager call's bits."""
    module = variant_module(name)
    inp = make_inputs(3, next_n, heads, [900, 0, 511], kv_block_size=kv_block_size, preshuffle=preshuffle,
                      device="cuda", fp8_dtype=fp8_dtype(device_arch()), seed=5)
    args = launch_args(inp)
    config = module.default_config(args.problem)
    module.launch(args, config)  # warm-up: compile (and size a balanced grid) outside the checks
    torch.cuda.synchronize()
    eager = args.out.clone()
    torch.cuda.set_sync_debug_mode("error")
    try:
        module.launch(args, config)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        module.launch(args, config)
    args.out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(args.out.view(torch.int32), eager.view(torch.int32))


@pytest.mark.parametrize("seed", range(8))
def test_gathered_key_tiles_on_the_register_mma_twin(seed):
    """The shared kernel body's ``KeyLoad=lds`` path (``kernels/mfma.py``: keys gathered in whole rows,
    pages in that layout, ``gl.convert_layout`` to the operand) run with the ``mma_v2`` atoms on
    sm_90, so the H200 executes the index and conversion code the AMD ``lds`` kernels compile."""
    module = variant_module("mma_v2")
    from paged_mqa_logits.backends.gluon import common
    from paged_mqa_logits.backends.gluon.kernels import mfma as mfma_kernels
    from paged_mqa_logits.backends.gluon.kernels.register_mma import register_mma_logits_kernel_key_layout

    arch = device_arch()
    case = random_case(9500 + seed, heads=(32, 64), max_context=700, max_batch=4, kv_block_sizes=(1, 16, 64, 256))
    case["preshuffle"] = False
    inp = build(case, device="cuda", fp8_dtype=fp8_dtype(arch))
    args = launch_args(inp)
    p = args.problem
    config = [c for c in module.candidates(p) if c["Schedule"] == "split"][seed % 3]
    grid, splits = module.program_grid(p, config)
    warps = module.options(p, config)["num_warps"]
    kwargs = dict(module.constexprs(p, config), **module.options(p, config),
                  KEY_LAYOUT=mfma_kernels.gather_layout(8, warps, 32), KEY_OPERAND=mfma_kernels.keys_to_operand)
    before = inp["out_logits"].clone()
    register_mma_logits_kernel_key_layout[grid](*common.kernel_arguments(args, splits), **kwargs)
    torch.cuda.synchronize()
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                           inp["max_model_len"], kv_block_size=inp["kv_block_size"], preshuffle=False)
    check = check_logits(inp["out_logits"], before, ref)
    assert check.ok, f"{case} {config}: {check.describe()}"


@pytest.mark.parametrize("seed", range(8))
def test_two_tile_prefetch_on_the_register_mma_twin(seed):
    """The shared kernel body's two-tile loop (``PREFETCH=2``: ``mfma`` ``Prefetch=2``; the odd
    range's second tile is scored and not stored) run with the ``mma_v2`` atoms on sm_90, Q in
    registers, both schedules and several splits per sequence (so an odd split is followed by the
    next split's tiles, which must stay unwritten by it)."""
    module = variant_module("mma_v2")
    from paged_mqa_logits.backends.gluon import common
    from paged_mqa_logits.backends.gluon.kernels.register_mma import register_mma_logits_kernel

    arch = device_arch()
    case = random_case(9700 + seed, heads=(32, 64), max_context=900, max_batch=4, kv_block_sizes=(1, 16, 64, 256))
    inp = build(case, device="cuda", fp8_dtype=fp8_dtype(arch))
    args = launch_args(inp)
    p = args.problem
    register_q = [c for c in module.candidates(p) if not c["QInLDS"] and c["Prefetch"] and not c["ReuseKV"]]
    if not register_q:
        pytest.skip(f"no Q-in-registers candidate with prefetch for {case}")
    config = dict(register_q[seed % len(register_q)], SplitKV=3 if seed % 2 else 0)
    grid, splits = module.program_grid(p, config)
    kwargs = dict(module.constexprs(p, config), **module.options(p, config), PREFETCH=2)
    before = inp["out_logits"].clone()
    register_mma_logits_kernel[grid](*common.kernel_arguments(args, splits), **kwargs)
    torch.cuda.synchronize()
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                           inp["max_model_len"], kv_block_size=inp["kv_block_size"], preshuffle=inp["preshuffle"])
    check = check_logits(inp["out_logits"], before, ref)
    assert check.ok, f"{case} {config}: {check.describe()}"
