"""``HeadSum=tensor`` on an sm_90 GPU (kernel ``backends/gluon/kernels/wgmma_pipes.py``, helpers in
``kernels/wgmma.py``): the weighted ReLU head sum as a bf16 wgmma. Every case checks the
contract's error bound for it (docs/CONTRACT.md), per logit,

    |ours - exact| <= 2^-8 * scale * sum_h |w_h| relu(s_h)

(each ReLU'd score rounded once to bf16, the weights split into two bf16 parts), a calc_diff of at
most 1e-5 against the fp32 reference, and that nothing outside the visible positions is written
(or, with ``clean_logits``, that it is ``-inf``): every team shape that admits it, next_n 1-8, 32 and
64 heads, every block size, 1-D and 2-D lengths, fp32 and bf16 logits, on adversarial inputs
(mixed-sign weights over 24 binades, key scales over 20).

Skipped (with the reason printed) without an sm_90 GPU.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from paged_mqa_logits.backends.gluon.wgmma_pipes import headsum_reason
from paged_mqa_logits.reference import _block_views, calc_diff, check_logits, make_inputs, reference_logits
from test_gluon_gpu import launch_args, variant_module

pytestmark = pytest.mark.gpu

#: (Consumers, RowSplit, CtasPerSM, RowsPerMMA, num_stages, KeyCopy, Schedule)
TEAMS = (
    (4, 1, 1, 1, 3, "tma", "balanced"),
    (4, 2, 1, 1, 4, "tma", "balanced"),
    (2, 1, 1, 4, 6, "tma", "balanced"),
    (2, 1, 1, 2, 4, "gather", "balanced"),
    (4, 2, 1, 2, 4, "tma", "split"),
    (1, 1, 2, 2, 4, "tma", "split"),
)


def _config(index: int, rows: int | None = None) -> dict:
    consumers, split, ctas, default_rows, stages, key_copy, schedule = TEAMS[index]
    return {"variant": "wgmma_pipes", "Consumers": consumers, "RowSplit": split, "CtasPerSM": ctas,
            "RowsPerMMA": rows or default_rows, "num_stages": stages, "KeyCopy": key_copy, "Schedule": schedule,
            "Overlap": 0, "HeadSum": "tensor"}


def _adversarial(inp: dict, gen: torch.Generator) -> None:
    """Weights of both signs spread over 2^-12..2^12 and key scales over 2^-10..2^10, in place."""
    w = inp["weights"]
    w.mul_(torch.exp2(torch.randint(-12, 13, w.shape, generator=gen, device="cpu").float()).to(w.device))
    _, scale_bytes = _block_views(inp["kv_cache"], inp["kv_block_size"])
    scales = scale_bytes.contiguous().view(torch.float32)
    spread = torch.exp2(torch.randint(-10, 11, scales.shape, generator=gen, device="cpu").float()).to(scales.device)
    scale_bytes.copy_((scales * spread).view(torch.uint8))


def _reference(inp: dict, weights: torch.Tensor) -> torch.Tensor:
    return reference_logits(inp["q_fp8"], inp["kv_cache"], weights, inp["context_lens"], inp["kv_indices"],
                            inp["max_model_len"], kv_block_size=inp["kv_block_size"], q_scale=inp.get("q_scale"))


def _check_bound(inp: dict, out: torch.Tensor, before: torch.Tensor, fp32_head_sum: torch.Tensor, *,
                 clean_logits: bool) -> None:
    """The head sum's own error: against the same kernel with ``HeadSum=fp32`` (the scores are the
    same wgmma's, whose fp8 accumulation both share), within the bound per logit; and both within
    calc_diff 1e-5 of the reference (fp32 logits), nothing else written."""
    ref = _reference(inp, inp["weights"])
    check = check_logits(out, before, ref, clean_logits=clean_logits)
    assert check.untouched, check.describe()
    valid = torch.isfinite(ref)
    got = out[:ref.shape[0], :ref.shape[1]].float()
    exact = fp32_head_sum[:ref.shape[0], :ref.shape[1]].float()
    magnitude = _reference(inp, inp["weights"].abs())
    # bf16 logits: both outputs are rounded to bf16 (8 significant bits, up to 2^-8 of a value each),
    # the tensor head sum's and the fp32 one it is compared with, on top of the head sum's bound (one
    # rounding charged alone was exceeded by 1.9% on an H100, wgmma at next_n 8); the fp32 head sum's
    # own rounding (fp32 adds of up to 2H terms)
    output_rounding = 2.0 ** -7 * exact.abs() * (1 + 2.0 ** -7) if out.dtype == torch.bfloat16 else 0.0
    err = (got - exact).abs()
    bound = 2.0 ** -8 * magnitude * (1 + 2.0 ** -12) + output_rounding + 1e-30
    worst = float((err[valid] / bound[valid]).max()) if bool(valid.any()) else 0.0
    assert worst <= 1.0, f"error {worst:.3f} x the bound"
    if out.dtype == torch.float32 and bool(valid.any()):
        assert calc_diff(got[valid], ref[valid]) <= 1e-5, calc_diff(got[valid], ref[valid])


def _launch_both(module, args, inp: dict, config: dict, clean: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(before, fp32 head sum's output)``; ``inp["out_logits"]`` then holds the tensor head sum's."""
    before = inp["out_logits"].clone()
    fp32 = before.clone()
    module.launch(dataclasses.replace(args, out=fp32, clean_logits=clean), dict(config, HeadSum="fp32"))
    module.launch(dataclasses.replace(args, clean_logits=clean), config)
    torch.cuda.synchronize()
    return before, fp32


#: (team, heads, next_n, kv_block_size): every team and next_n 1-8 at least once, both head counts,
#: TMA boxes of one and two blocks a tile, gathered blocks of one token
CASES = ((0, 64, 1, 64), (1, 64, 2, 32), (2, 64, 4, 64), (2, 64, 4, 32), (3, 64, 3, 1), (4, 64, 4, 64),
         (5, 64, 2, 64), (0, 32, 5, 32), (1, 32, 4, 64), (2, 32, 8, 64), (3, 32, 6, 64), (4, 32, 7, 32),
         (5, 32, 1, 64), (2, 64, 8, 64), (0, 32, 2, 1))


@pytest.mark.parametrize("team,heads,next_n,kv_block_size", CASES)
def test_tensor_head_sum_within_bound(team, heads, next_n, kv_block_size):
    module = variant_module("wgmma_pipes")
    rng = random.Random(team * 97 + heads + next_n * 7 + kv_block_size)
    lens = [rng.choice((0, 1, 63, 64, 65, rng.randint(1, 2500))) for _ in range(13)]
    lens[0] = 2500
    inp = make_inputs(13, next_n, heads, lens, kv_block_size=kv_block_size, device="cuda", seed=team + next_n,
                      max_model_len=2600, out_row_pad=1, table_row_pad=1, lens_2d=bool(team % 2 == 0))
    _adversarial(inp, torch.Generator().manual_seed(team))
    args = launch_args(inp)
    config = None
    for rows in (TEAMS[team][3], 1):
        candidate = _config(team, rows)
        if (module.unsupported(args.problem) is None and headsum_reason(args.problem, rows, 0) is None
                and module.admits(args.problem, candidate)):
            config = candidate
            break
    if config is None:
        pytest.skip(f"no HeadSum=tensor config of team {TEAMS[team]} fits {args.problem.describe()}")
    clean = bool(team % 3 == 0)
    before, fp32 = _launch_both(module, args, inp, config, clean)
    _check_bound(inp, inp["out_logits"], before, fp32, clean_logits=clean)


@pytest.mark.parametrize("next_n", (2, 4))
def test_bf16_logits(next_n):
    module = variant_module("wgmma_pipes")
    inp = make_inputs(9, next_n, 64, [3000, 5, 0, 129, 1000, 64, 2999, 17, 700], kv_block_size=64, device="cuda",
                      seed=5, logits_dtype=torch.bfloat16, max_model_len=3100)
    args = launch_args(inp)
    before, fp32 = _launch_both(module, args, inp, _config(2 if next_n == 4 else 0), False)
    _check_bound(inp, inp["out_logits"], before, fp32, clean_logits=False)


def test_dispatch_and_graph_replay_after_lengths_change():
    """The op forced to a tensor config, captured in a CUDA graph, replayed with new lengths."""
    from paged_mqa_logits import op

    variant_module("wgmma_pipes")
    lens = [2000, 1500, 3, 900]
    inp = make_inputs(4, 4, 64, lens, kv_block_size=64, device="cuda", seed=11, max_model_len=2100)
    config = _config(2)

    def call():
        op.paged_mqa_logits_eager(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"],
                                  inp["context_lens"], inp["kv_indices"], inp["max_model_len"], False, 64,
                                  backend="gluon", config=config)

    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    new = torch.tensor([[max(n - 3 + j, 0) for j in range(4)] for n in (100, 2000, 0, 1999)], dtype=torch.int32)
    inp["context_lens"].copy_(new.cuda())
    inp["out_logits"].fill_(float("nan"))
    before = inp["out_logits"].clone()
    graph.replay()
    torch.cuda.synchronize()
    fp32 = before.clone()
    module = variant_module("wgmma_pipes")
    module.launch(dataclasses.replace(launch_args(inp), out=fp32), dict(config, HeadSum="fp32"))
    torch.cuda.synchronize()
    _check_bound(inp, inp["out_logits"], before, fp32, clean_logits=False)


# ----------------------------------------------------------------------------- wgmma_ws
#: (ChunkK, RowsPerMMA, num_stages, CtasPerSM, Consumers, RowSplit, KeyCopy) of ``wgmma_ws``
WS_SETTINGS = (
    (64, 2, 4, 2, 1, 1, "gather"),
    (128, 2, 4, 1, 2, 1, "tma"),
    (64, 2, 8, 1, 4, 2, "tma"),
    (64, 4, 8, 1, 2, 1, "tma"),
    (64, 1, 6, 3, 1, 1, "gather"),
    (128, 1, 4, 2, 1, 1, "gather"),
)

#: (setting, heads, next_n, kv_block_size): every setting, next_n 1-8, both head counts, 128-token
#: tiles of two 64-token blocks and of four 32-token ones, gathered one-token blocks
WS_CASES = ((0, 64, 2, 64), (0, 32, 4, 32), (1, 64, 2, 64), (1, 32, 2, 32), (2, 64, 2, 64), (2, 32, 4, 64),
            (3, 64, 4, 64), (3, 32, 8, 64), (4, 32, 2, 1), (4, 32, 1, 64), (5, 32, 2, 64), (0, 64, 1, 32),
            (3, 64, 4, 1))


def _ws_config(setting: tuple, rows: int) -> dict:
    chunk, _, stages, ctas, consumers, split, key_copy = setting
    return {"variant": "wgmma_ws", "ChunkK": chunk, "RowsPerMMA": rows, "num_stages": stages, "CtasPerSM": ctas,
            "Consumers": consumers, "RowSplit": split, "KeyCopy": key_copy, "HeadSum": "tensor"}


@pytest.mark.parametrize("setting,heads,next_n,kv_block_size", WS_CASES)
def test_wgmma_ws_tensor_head_sum_within_bound(setting, heads, next_n, kv_block_size):
    """``wgmma_ws`` with ``HeadSum=tensor`` (its consumers run ``wgmma.score_tile_tensor``): the
    same bound against the same kernel's fp32 head sum; the setting's ``RowsPerMMA``, else the
    first of 4, 2, 1 that it admits."""
    module = variant_module("wgmma_ws")
    rng = random.Random(setting * 31 + heads + next_n * 5 + kv_block_size)
    lens = [rng.choice((0, 1, 63, 64, 65, 127, 129, rng.randint(1, 2500))) for _ in range(11)]
    lens[0] = 2500
    inp = make_inputs(11, next_n, heads, lens, kv_block_size=kv_block_size, device="cuda", seed=setting + next_n,
                      max_model_len=2600, out_row_pad=1, table_row_pad=1, lens_2d=bool(setting % 2 == 0))
    _adversarial(inp, torch.Generator().manual_seed(setting + 100))
    args = launch_args(inp)
    config = None
    if module.unsupported(args.problem) is None:
        for rows in (WS_SETTINGS[setting][1], 4, 2, 1):
            candidate = _ws_config(WS_SETTINGS[setting], rows)
            try:
                admitted = module.admits(args.problem, candidate)
            except ValueError:  # unequal row groups at this RowsPerMMA
                admitted = False
            if admitted:
                config = candidate
                break
    if config is None:
        pytest.skip(f"no HeadSum=tensor config of {WS_SETTINGS[setting]} fits {args.problem.describe()}")
    before, fp32 = _launch_both(module, args, inp, config, False)
    _check_bound(inp, inp["out_logits"], before, fp32, clean_logits=False)


def test_wgmma_ws_bf16_logits():
    module = variant_module("wgmma_ws")
    inp = make_inputs(9, 2, 64, [3000, 5, 0, 129, 1000, 64, 2999, 17, 700], kv_block_size=64, device="cuda",
                      seed=6, logits_dtype=torch.bfloat16, max_model_len=3100)
    args = launch_args(inp)
    before, fp32 = _launch_both(module, args, inp, _ws_config(WS_SETTINGS[1], 2), False)
    _check_bound(inp, inp["out_logits"], before, fp32, clean_logits=False)


#: (heads, next_n, kv_block_size, lens_2d, Schedule): ``wgmma`` with ``HeadSum=tensor``, one row
#: group and two, next_n 1/2/4/8, both schedules, gathered one-token blocks, bf16 logits at next_n 8
WGMMA_CASES = ((64, 2, 64, True, "balanced"), (64, 4, 64, False, "split"), (32, 4, 32, True, "split"),
               (32, 8, 64, False, "balanced"), (64, 1, 1, True, "balanced"), (64, 2, 16, False, "split"),
               (64, 4, 32, True, "balanced"))


def _tensor_candidate(module, problem, schedule: str, chunk: int | None = None) -> dict:
    """The variant's first ``HeadSum=tensor`` candidate of ``schedule`` (and ``ChunkK``, when given)."""
    found = [c for c in module.candidates(problem) if c.get("HeadSum") == "tensor" and c["Schedule"] == schedule
             and chunk in (None, c["ChunkK"])]
    if not found:
        pytest.skip(f"no HeadSum=tensor candidate of {module.name} ({schedule}) for {problem.describe()}")
    return found[0]


@pytest.mark.parametrize("heads,next_n,kv_block_size,lens_2d,schedule", WGMMA_CASES)
def test_wgmma_tensor_head_sum_within_bound(heads, next_n, kv_block_size, lens_2d, schedule):
    """``wgmma`` with ``HeadSum=tensor`` (``wgmma.score_tile_tensor`` after its cp.async ring): the
    bound against the same kernel's fp32 head sum; nothing past a row's positions written (the op's
    tail kernel writes ``clean_logits``' ``-inf`` for this variant, so it is launched without)."""
    module = variant_module("wgmma")
    rng = random.Random(heads * 3 + next_n * 11 + kv_block_size)
    lens = [rng.choice((0, 1, 63, 64, 65, 127, 129, rng.randint(1, 2500))) for _ in range(9)]
    lens[1] = 2500
    dtype = torch.bfloat16 if next_n == 8 else torch.float32
    inp = make_inputs(9, next_n, heads, lens, kv_block_size=kv_block_size, device="cuda", seed=heads + next_n,
                      max_model_len=2600, out_row_pad=1, table_row_pad=1, lens_2d=lens_2d, logits_dtype=dtype)
    _adversarial(inp, torch.Generator().manual_seed(next_n))
    args = launch_args(inp)
    config = _tensor_candidate(module, args.problem, schedule)
    before, fp32 = _launch_both(module, args, inp, config, False)
    _check_bound(inp, inp["out_logits"], before, fp32, clean_logits=False)


#: (heads, next_n, kv_block_size, lens_2d, ChunkK): ``wgmma_fp4`` with ``HeadSum=tensor``
FP4_CASES = ((64, 1, 64, True, 64), (64, 2, 64, False, 64), (32, 4, 32, True, 64), (32, 2, 1, False, 128),
             (64, 1, 64, False, 128))


@pytest.mark.parametrize("heads,next_n,kv_block_size,lens_2d,chunk", FP4_CASES)
def test_wgmma_fp4_tensor_head_sum_within_bound(heads, next_n, kv_block_size, lens_2d, chunk):
    """MXFP4 (``wgmma_fp4``) with ``HeadSum=tensor``: the widened query's power-of-two factors ride
    on the weights the head sum splits; the same bound against the kernel's fp32 head sum, the
    fp4 reference for calc_diff. Weights of both signs over 2^-12..2^12."""
    from fp4_gpu_checks import fp4_inputs, launch_args as fp4_launch_args, sm90_variant

    module = sm90_variant("wgmma_fp4")
    rng = random.Random(heads + next_n * 13 + kv_block_size + chunk)
    lens = [rng.choice((0, 1, 63, 64, 65, 129, rng.randint(1, 2500))) for _ in range(9)]
    lens[0] = 2500
    inp = fp4_inputs(next_n, kv_block_size, heads, lens, lens_2d, seed=next_n + chunk)
    w = inp["weights"]
    gen = torch.Generator().manual_seed(heads + chunk)
    w.mul_(torch.exp2(torch.randint(-12, 13, w.shape, generator=gen).float()).to(w.device))
    args = fp4_launch_args(inp)
    for schedule in ("balanced", "split"):
        config = _tensor_candidate(module, args.problem, schedule, chunk)
        inp["out_logits"].fill_(float("nan"))
        before, fp32 = _launch_both(module, args, inp, config, False)
        _check_bound(inp, inp["out_logits"], before, fp32, clean_logits=False)
