"""The sm_90 ``wgmma_fp4`` variant (backends/gluon/hopper_fp4.py) on an H200, against the exact
MXFP4 reference (``reference.reference_logits`` with ``q_scale``): ``calc_diff < 5e-6`` on every
visible position, every other position untouched bit for bit (``-inf`` where ``clean_logits``
asks for it).

Matrix: next_n 1-4 x KVBlockSize 32/64, heads 32 and 64 across them, 1-D and 2-D lengths,
ragged lengths with a zero-length sequence and one shorter than next_n (zero-length rows),
padded block strides and table / output rows; fp32 logits with the default config, and in four
cases a candidate (walking ChunkK, RowsPerMMA, both schedules); bf16 logits with the default
once per next_n; ``clean_logits`` off and on. KVBlockSize 1/16/128/256 with the default config
(a block stride not 16-byte aligned among them). Then through the public op (forced to the
variant, and left to the dispatcher, which must pick it), and a CUDA graph replayed after the
lengths changed in place. Every distinct kernel compiles on first use: the matrix is sized for
about a minute on the H200. Skipped without an sm_90 GPU.
Run: ``python -m pytest -q -m gpu tests/backends/gluon/test_hopper_fp4_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

import paged_mqa_logits
from paged_mqa_logits import dispatch
from paged_mqa_logits.op import build_launch_args
from paged_mqa_logits.reference import calc_diff, check_logits, make_inputs, reference_logits

pytestmark = pytest.mark.gpu

NAME = "wgmma_fp4"
MAX_DIFF = 5e-6
#: (next_n, kv_block_size): heads alternate between 32 and 64, and so do 1-D / 2-D lengths
CASES = tuple((next_n, bs) for next_n in (1, 2, 3, 4) for bs in (32, 64))
#: the cases that also run a candidate (ChunkK, RowsPerMMA and the schedules walked across them)
WALKED = (1, 4, 6, 7)


def _skip(reason: str):
    print(f"\nSKIP: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def variant():
    if not torch.cuda.is_available():
        _skip("no CUDA GPU: the wgmma_fp4 kernel runs on sm_90 only")
    from paged_mqa_logits.arch import detect

    arch = detect("cuda").arch
    if arch != "sm_90":
        _skip(f"wgmma_fp4 targets sm_90, this GPU is {arch}")
    from paged_mqa_logits.backends.gluon import import_errors, variants

    found = [v for v in variants() if v.name == NAME]
    if not found:
        _skip(f"{NAME} is not importable: {import_errors().get('hopper_fp4')}")
    return found[0]


def fp4_inputs(next_n, bs, heads, lens, lens_2d, seed, logits_dtype=torch.float32, **kwargs) -> dict:
    return make_inputs(len(lens), next_n, heads, lens, kv_block_size=bs, lens_2d=lens_2d, device="cuda",
                       kv_format="fp4", seed=seed, max_model_len=max(lens) + 40, logits_dtype=logits_dtype, **kwargs)


def reference_of(inp: dict) -> torch.Tensor:
    return reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                            inp["max_model_len"], kv_block_size=inp["kv_block_size"], q_scale=inp["q_scale"])


def positional(inp: dict) -> tuple:
    return (inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"], inp["context_lens"], inp["kv_indices"],
            inp["max_model_len"], False, inp["kv_block_size"])


def launch_args(inp: dict):
    return build_launch_args(*positional(inp), q_scale=inp["q_scale"])


def assert_matches(inp: dict, before: torch.Tensor, ref: torch.Tensor, clean: bool, what: str) -> None:
    out = inp["out_logits"]
    check = check_logits(out, before, ref, clean_logits=clean)
    assert check.untouched, f"{what}: positions outside the visible ones changed ({check.describe()})"
    visible = torch.isfinite(ref)
    rows, width = ref.shape
    got = out[:rows, :width][visible].float()
    assert not bool(torch.isnan(got).any()), f"{what}: NaN at visible positions"
    diff = calc_diff(got, ref[visible].float())
    assert diff < MAX_DIFF, f"{what}: calc_diff {diff:.3g} >= {MAX_DIFF}"


def run_op(inp: dict, clean: bool, **kwargs) -> torch.Tensor:
    """``out_logits`` NaN-filled, then the public op on ``inp``; returns the copy from before."""
    inp["out_logits"].fill_(float("nan"))
    before = inp["out_logits"].clone()
    paged_mqa_logits.paged_mqa_logits(*positional(inp), q_scale=inp["q_scale"], clean_logits=clean, **kwargs)
    torch.cuda.synchronize()
    return before


@pytest.mark.parametrize("case", range(len(CASES)))
def test_against_the_exact_reference(variant, case):
    next_n, bs = CASES[case]
    heads = 64 if (next_n + bs // 32) % 2 else 32
    lens_2d = case % 2 == 0
    lens = [515 + 37 * next_n, 0, 129 + bs, next_n - 1, 64]
    inp = fp4_inputs(next_n, bs, heads, lens, lens_2d, seed=70 + case, block_stride_pad=16, table_row_pad=1,
                     out_row_pad=2)
    problem = launch_args(inp).problem
    assert variant.unsupported(problem) is None
    ref = reference_of(inp)
    candidates = variant.candidates(problem)
    walked = case in WALKED and bool(candidates)
    configs = [variant.default_config(problem)] + [candidates[(case * 3 + 1) % len(candidates)]] * walked
    for index, config in enumerate(configs):
        clean = bool((case + index) % 2)
        before = run_op(inp, clean, backend="gluon", config=config)
        assert_matches(inp, before, ref, clean, f"{config} clean_logits={clean}")
    if bs != 64:
        return  # bf16 logits: once per next_n (each case's kernels compile anew: keep the run short)
    bf16 = dict(inp, out_logits=torch.empty_like(inp["out_logits"], dtype=torch.bfloat16))
    bf16_problem = launch_args(bf16).problem
    assert bf16_problem.shape_key.logits_dtype == "bf16" and variant.unsupported(bf16_problem) is None
    for clean in (False, True):
        before = run_op(bf16, clean, backend="gluon", config=variant.default_config(bf16_problem))
        assert_matches(bf16, before, ref, clean, f"bf16 logits, clean_logits={clean}")


@pytest.mark.parametrize("bs", [1, 16, 128, 256])
def test_other_block_sizes(variant, bs):
    """The block sizes past 32/64 it serves (the same per-token page lookup), default config."""
    lens = [300 + bs, 0, 77]
    inp = fp4_inputs(2, bs, 64, lens, bs % 32 == 0, seed=bs, block_stride_pad=4 * (bs == 16))
    ref = reference_of(inp)
    for clean in (False, True):
        before = run_op(inp, clean, backend="gluon", config={"variant": NAME})
        assert_matches(inp, before, ref, clean, f"KVBlockSize {bs}, clean_logits={clean}")


def test_the_dispatcher_picks_it_and_the_public_op_runs_it(variant):
    from paged_mqa_logits.backends.gluon import BACKEND

    inp = fp4_inputs(3, 64, 64, [700, 3, 0, 260], False, seed=5)  # the kernel of a case above
    problem = launch_args(inp).problem
    choice = dispatch.choose(problem)
    assert choice.backend == "gluon", choice
    assert BACKEND.variant(problem, choice.config) is variant, choice
    ref = reference_of(inp)
    for clean in (False, True):
        before = run_op(inp, clean)  # the dispatcher's pick
        assert_matches(inp, before, ref, clean, f"dispatched, clean_logits={clean}")
    before = run_op(inp, False, backend="gluon", config={"variant": NAME})  # forced, every other knob defaulted
    assert_matches(inp, before, ref, False, "forced")


def lengths_like(inp: dict, lens: list[int]) -> torch.Tensor:
    """``lens`` in the layout of ``inp``'s lengths (2-D: row ``j`` sees ``L - next_n + 1 + j``)."""
    lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
    if inp["context_lens"].dim() == 1:
        return lens_t
    next_n = inp["context_lens"].shape[1]
    offsets = torch.arange(next_n, dtype=torch.int32, device="cuda") - (next_n - 1)
    return (lens_t[:, None] + offsets[None, :]).clamp_min(0).to(torch.int32)


@pytest.mark.parametrize("lens_2d", [False, True])
def test_cuda_graph_replay_after_the_lengths_change(variant, lens_2d):
    inp = fp4_inputs(2, 64, 32, [900, 5, 70, 333], lens_2d, seed=9)
    config = {"variant": NAME}
    run_op(inp, True, backend="gluon", config=config)  # warm-up: compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_mqa_logits.paged_mqa_logits(*positional(inp), q_scale=inp["q_scale"], clean_logits=True,
                                          backend="gluon", config=config)
    # shorter (each within its blocks), one sequence emptied, one row of another left zero-length
    inp["context_lens"].copy_(lengths_like(inp, [640, 0, 1, 333]))
    inp["out_logits"].fill_(float("nan"))
    before = inp["out_logits"].clone()
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(inp, before, reference_of(inp), True, f"graph replay, lens_2d={lens_2d}")
