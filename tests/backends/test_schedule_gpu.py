"""The balanced schedule on a GPU, for every GPU kernel that serves the device: widely ragged
batches, zero-length rows between long ones, batch up to 1024 (past one 512-sequence scan
step), next_n 3/5/7, and CUDA-graph replay after the lengths change in place (the longest
sequence included). Also the Gluon device-side share computation against the Python model.

Skipped (with the reason printed) without a CUDA/ROCm GPU.
"""

from __future__ import annotations

import random

import pytest
import torch

from paged_mqa_logits.op import build_launch_args, launch
from paged_mqa_logits.reference import check_logits, make_inputs, reference_logits
from paged_mqa_logits.schedule import locate, share, tile_counts

pytestmark = pytest.mark.gpu

gluon_device = pytest.importorskip("paged_mqa_logits.backends.gluon.kernels.device")
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402


@gluon.jit
def _gluon_shares_kernel(lens_ptr, out_ptr, batch, stride_b, stride_j, max_model_len, max_blocks,
                         NEXT_N: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr, CHUNK: gl.constexpr, THREADS: gl.constexpr):
    """Each program stores the ``(start, stop, seq, tile)`` the Gluon kernels start from."""
    p = gl.program_id(0)
    start, stop, seq, tile = gluon_device.balanced_share(
        lens_ptr, batch, stride_b, stride_j, max_model_len, max_blocks, p, gl.num_programs(0), NEXT_N, True,
        KV_BLOCK_SIZE, CHUNK, gluon_device.scan_layout(THREADS, gl.num_warps()))
    gl.store(out_ptr + p * 4 + 0, start)
    gl.store(out_ptr + p * 4 + 1, stop)
    gl.store(out_ptr + p * 4 + 2, seq)
    gl.store(out_ptr + p * 4 + 3, tile)


def _skip(reason: str):
    print(f"\nSKIP: {reason}")
    pytest.skip(reason)


def _arch() -> str:
    if not torch.cuda.is_available():
        _skip("no CUDA/ROCm GPU: the balanced schedule's device code only runs on one")
    from paged_mqa_logits.arch import detect

    return detect("cuda").arch


def _fp8(arch: str):
    return torch.float8_e4m3fnuz if arch == "gfx942" else torch.float8_e4m3fn


#: (backend, config) pairs forced to the balanced schedule, per arch
def _kernels(arch: str) -> list[tuple[str, dict]]:
    out = [("triton", {"Schedule": "balanced", "ChunkK": 64})]
    if arch == "sm_90":
        out += [("gluon", {"variant": "wgmma", "Schedule": "balanced"}),
                ("gluon", {"variant": "wgmma", "Schedule": "balanced", "ChunkK": 128, "RowsPerMMA": 1}),
                ("gluon", {"variant": "mma_v2", "Schedule": "balanced", "ChunkK": 64, "num_warps": 4, "Prefetch": 0}),
                ("gluon", {"variant": "wgmma_ws"}),
                ("gluon", {"variant": "wgmma_ws", "ChunkK": 128, "RowsPerMMA": 1, "num_stages": 3}),
                # consumer warpgroups taking turns over one producer's ring, across sequences
                ("gluon", {"variant": "wgmma_ws", "ChunkK": 64, "num_stages": 8, "CtasPerSM": 1, "Consumers": 2,
                           "RowSplit": 1}),
                ("gluon", {"variant": "wgmma_ws", "ChunkK": 64, "RowsPerMMA": 1, "num_stages": 5, "CtasPerSM": 1,
                           "Consumers": 3, "RowSplit": 1}),
                # keys by TMA, one box per cache block (two per 128-token tile)
                ("gluon", {"variant": "wgmma_ws", "KeyCopy": "tma"}),
                ("gluon", {"variant": "wgmma_ws", "ChunkK": 128, "RowsPerMMA": 1, "num_stages": 4, "CtasPerSM": 1,
                           "Consumers": 2, "RowSplit": 1, "KeyCopy": "tma"}),
                # two consumers per tile, each scoring one of its row groups
                ("gluon", {"variant": "wgmma_ws", "ChunkK": 64, "RowsPerMMA": 1, "num_stages": 8, "CtasPerSM": 1,
                           "Consumers": 4, "RowSplit": 2}),
                ("gluon", {"variant": "wgmma_ws", "ChunkK": 64, "RowsPerMMA": 1, "num_stages": 4, "CtasPerSM": 2,
                           "Consumers": 2, "RowSplit": 2, "KeyCopy": "tma"}),
                # consumer teams with their own producer warps and rings
                ("gluon", {"variant": "wgmma_pipes", "Consumers": 4, "RowSplit": 1, "CtasPerSM": 1, "RowsPerMMA": 1,
                           "num_stages": 3, "KeyCopy": "tma", "Schedule": "balanced"}),
                ("gluon", {"variant": "wgmma_pipes", "Consumers": 4, "RowSplit": 2, "CtasPerSM": 1, "RowsPerMMA": 1,
                           "num_stages": 4, "KeyCopy": "tma", "Schedule": "balanced"}),
                ("gluon", {"variant": "wgmma_pipes", "Consumers": 3, "RowSplit": 1, "CtasPerSM": 1, "RowsPerMMA": 1,
                           "num_stages": 3, "KeyCopy": "gather", "Schedule": "balanced"}),
                ("gluon", {"variant": "wgmma_pipes", "Consumers": 1, "RowSplit": 1, "CtasPerSM": 2, "RowsPerMMA": 2,
                           "num_stages": 4, "KeyCopy": "tma", "Schedule": "balanced"})]
    elif arch in ("gfx942", "gfx950"):
        out += [("gluon", {"variant": "mfma", "Schedule": "balanced"})]
    return out


KERNEL_IDS = ["triton", "wgmma64", "wgmma128", "mma_v2", "wgmma_ws64", "wgmma_ws128", "wgmma_ws_2consumers",
              "wgmma_ws_3consumers", "wgmma_ws_tma64", "wgmma_ws_tma128_2consumers", "wgmma_ws_4consumers_rowsplit",
              "wgmma_ws_tma_2x2consumers_rowsplit", "pipes_4x1_tma", "pipes_2x2_tma", "pipes_3x1_gather",
              "pipes_1x1_2ctas"]


def _kernel(index: int):
    arch = _arch()
    kernels = _kernels(arch)
    if index >= len(kernels):
        _skip(f"no kernel #{index} on {arch}")
    return arch, kernels[index]


def _args(inp: dict):
    return build_launch_args(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"], inp["context_lens"],
                             inp["kv_indices"], inp["max_model_len"], inp["preshuffle"], inp["kv_block_size"])


def _check(inp: dict, before: torch.Tensor):
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                           inp["max_model_len"], kv_block_size=inp["kv_block_size"], preshuffle=inp["preshuffle"])
    return check_logits(inp["out_logits"], before, ref)


def _run(inp: dict, backend: str, config: dict):
    args = _args(inp)
    knobs = dict(config)
    if backend == "gluon":  # complete the variant's knobs from its default
        from paged_mqa_logits.backends import get

        variant = get("gluon").variant(args.problem, knobs)
        if variant.unsupported(args.problem) is not None:
            _skip(f"{variant.name}: {variant.unsupported(args.problem)}")
        knobs = {**variant.default_config(args.problem), **knobs}
        if knobs.get("Consumers", 1) > 1 and not variant.admits(args.problem, knobs):
            _skip(f"{variant.name}: {knobs} do not fit {args.problem.describe()}")
    before = inp["out_logits"].clone()
    launch(args, backend=backend, config=knobs)
    torch.cuda.synchronize()
    return _check(inp, before)


def _rows_2d(lengths: list[int]) -> torch.Tensor:
    """vLLM's 2-D lengths of next_n 2 for sequences of ``lengths`` tokens."""
    seq = torch.tensor(lengths, dtype=torch.int32, device="cuda")[:, None]
    return (seq - 1 + torch.arange(2, dtype=torch.int32, device="cuda")[None, :]).clamp_min(0)


def _wide_ragged(rng: random.Random, batch: int, context: int, zero_every: int = 0) -> list[int]:
    lens = [rng.randint(1, context) for _ in range(batch)]
    if zero_every:
        lens = [0 if b % zero_every == 1 else n for b, n in enumerate(lens)]
    lens[0] = context
    return lens


@pytest.mark.parametrize("kernel", range(len(KERNEL_IDS)), ids=KERNEL_IDS)
@pytest.mark.parametrize("next_n, heads, lens_2d", [(1, 64, True), (3, 32, True), (5, 64, False), (7, 32, True)])
def test_wide_ragged_batches(kernel, next_n, heads, lens_2d):
    arch, (backend, config) = _kernel(kernel)
    rng = random.Random(next_n * 100 + heads)
    lens = _wide_ragged(rng, 48, 5000, zero_every=5)  # zero-length rows between long ones
    inp = make_inputs(48, next_n, heads, lens, kv_block_size=64, lens_2d=lens_2d, device="cuda",
                      fp8_dtype=_fp8(arch), seed=next_n, out_row_pad=2)
    check = _run(inp, backend, config)
    assert check.ok, f"{backend} {config}: {check.describe()}"


@pytest.mark.parametrize("kernel", range(len(KERNEL_IDS)), ids=KERNEL_IDS)
def test_batch_1024_past_one_scan_step(kernel):
    arch, (backend, config) = _kernel(kernel)
    rng = random.Random(1024)
    lens = [0 if rng.random() < 0.2 else rng.randint(1, 400) for _ in range(1024)]
    inp = make_inputs(1024, 2, 32, lens, kv_block_size=16, preshuffle=True, device="cuda", fp8_dtype=_fp8(arch),
                      seed=11)
    check = _run(inp, backend, config)
    assert check.ok, f"{backend} {config}: {check.describe()}"


@pytest.mark.parametrize("kernel", range(len(KERNEL_IDS)), ids=KERNEL_IDS)
def test_graph_replay_after_lengths_change_in_place(kernel):
    """Captured once; the lengths are then rewritten in place (the longest sequence moves and
    grows, others shrink to 0) and the replay must follow them."""
    arch, (backend, config) = _kernel(kernel)
    capacity = [3000] * 24
    inp = make_inputs(24, 2, 64, capacity, kv_block_size=64, device="cuda", fp8_dtype=_fp8(arch), seed=21)
    lens = inp["context_lens"]
    rng = random.Random(7)
    lens.copy_(_rows_2d([rng.randint(1, 1500) for _ in range(24)]))
    args = _args(inp)
    knobs = dict(config)
    if backend == "gluon":
        from paged_mqa_logits.backends import get

        knobs = {**get("gluon").variant(args.problem, knobs).default_config(args.problem), **knobs}
    launch(args, backend=backend, config=knobs)  # warm-up: compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(args, backend=backend, config=knobs)
    for step in range(3):
        new = [0 if rng.random() < 0.3 else rng.randint(1, 3000) for _ in range(24)]
        new[(5 + 7 * step) % 24] = 3000  # the longest sequence moves and is longer than at capture
        lens.copy_(_rows_2d(new))
        inp["out_logits"].fill_(float("nan"))
        before = inp["out_logits"].clone()
        graph.replay()
        torch.cuda.synchronize()
        check = _check(inp, before)
        assert check.ok, f"replay {step} {backend} {config}: {check.describe()}"


def test_gluon_device_share_matches_the_model():
    """``common.balanced_share`` (the Gluon kernels' prefix sum) against ``schedule.share`` /
    ``schedule.locate``, over a batch of two scan steps with zero, clipped and 2-D lengths."""
    arch = _arch()
    rng = random.Random(3)
    batch, next_n, programs, chunk, kv_block_size, mml, max_blocks = 700, 2, 37, 64, 16, 5000, 250
    rows = [[0, 0] if rng.random() < 0.2 else [n - 1, n] for n in (rng.randint(1, 6000) for _ in range(batch))]
    lens = torch.tensor(rows, dtype=torch.int32, device="cuda")
    out = torch.full((programs, 4), -1, dtype=torch.int32, device="cuda")
    threads = 64 if arch.startswith("gfx") else 32
    _gluon_shares_kernel[(programs,)](lens, out, batch, lens.stride(0), lens.stride(1), mml, max_blocks, NEXT_N=next_n,
                               KV_BLOCK_SIZE=kv_block_size, CHUNK=chunk, THREADS=threads, num_warps=4)
    counts = tile_counts([min(max(r), mml, max_blocks * kv_block_size) for r in rows], chunk)
    for p, (start, stop, seq, tile) in enumerate(out.tolist()):
        assert (start, stop) == share(sum(counts), p, programs)
        if start < stop:
            assert (seq, tile) == locate(counts, start)
