"""The sm_90 ``wgmma_fp4_pipes`` variant (backends/gluon/hopper_fp4_pipes.py) on an H200, against
the exact MXFP4 reference, exactly as ``wgmma_fp4`` is checked (test_hopper_fp4_gpu.py: its
inputs, reference and comparison): ``calc_diff < 5e-6`` on every visible position, every other
position untouched bit for bit (``-inf`` where ``clean_logits`` asks for it).

Matrix: next_n 1-4 x KVBlockSize 32/64, heads 32 and 64 across them, 1-D and 2-D lengths,
ragged lengths with a zero-length sequence and one shorter than next_n (zero-length rows),
padded block strides and table / output rows; every candidate of each case (both schedules,
the team shapes, overlapped consumers where they fit), ``clean_logits`` alternating; bf16 logits
once per next_n. All forced through the public op (the variant is never the default). Then a
CUDA graph replayed after the lengths changed in place. Skipped without an sm_90 GPU.
Run: ``python -m pytest -q -m gpu tests/backends/gluon/test_hopper_fp4_pipes_gpu.py``.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

import paged_mqa_logits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_hopper_fp4_gpu import (assert_matches, fp4_inputs, launch_args, lengths_like, positional,  # noqa: E402
                                 reference_of, run_op)

pytestmark = pytest.mark.gpu

NAME = "wgmma_fp4_pipes"
CASES = tuple((next_n, bs) for next_n in (1, 2, 3, 4) for bs in (32, 64))


def _skip(reason: str):
    print(f"\nSKIP: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def variant():
    if not torch.cuda.is_available():
        _skip("no CUDA GPU: the wgmma_fp4_pipes kernel runs on sm_90 only")
    from paged_mqa_logits.arch import detect

    arch = detect("cuda").arch
    if arch != "sm_90":
        _skip(f"wgmma_fp4_pipes targets sm_90, this GPU is {arch}")
    from paged_mqa_logits.backends.gluon import import_errors, variants

    found = [v for v in variants() if v.name == NAME]
    if not found:
        _skip(f"{NAME} is not importable: {import_errors().get('hopper_fp4_pipes')}")
    return found[0]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_against_the_exact_reference(variant, case):
    next_n, bs = CASES[case]
    heads = 64 if (next_n + bs // 32) % 2 else 32
    lens_2d = case % 2 == 0
    # long enough for several tiles per team, a zero-length sequence, one shorter than next_n
    lens = [515 + 37 * next_n, 0, 129 + bs, next_n - 1, 64, 2000 + 61 * case]
    inp = fp4_inputs(next_n, bs, heads, lens, lens_2d, seed=170 + case, block_stride_pad=16, table_row_pad=1,
                     out_row_pad=2)
    problem = launch_args(inp).problem
    assert variant.unsupported(problem) is None
    ref = reference_of(inp)
    configs = [variant.default_config(problem)] + variant.candidates(problem)
    for index, config in enumerate(configs):
        clean = bool((case + index) % 2)
        before = run_op(inp, clean, backend="gluon", config=config)
        assert_matches(inp, before, ref, clean, f"{config} clean_logits={clean}")
    if bs != 64:
        return  # bf16 logits: once per next_n
    bf16 = dict(inp, out_logits=torch.empty_like(inp["out_logits"], dtype=torch.bfloat16))
    bf16_problem = launch_args(bf16).problem
    assert bf16_problem.shape_key.logits_dtype == "bf16" and variant.unsupported(bf16_problem) is None
    for clean in (False, True):
        before = run_op(bf16, clean, backend="gluon", config=variant.default_config(bf16_problem))
        assert_matches(bf16, before, ref, clean, f"bf16 logits, clean_logits={clean}")


def test_forced_by_name_with_every_other_knob_defaulted(variant):
    inp = fp4_inputs(3, 64, 64, [700, 3, 0, 260], False, seed=5)
    ref = reference_of(inp)
    for clean in (False, True):
        before = run_op(inp, clean, backend="gluon", config={"variant": NAME})
        assert_matches(inp, before, ref, clean, f"forced, clean_logits={clean}")


@pytest.mark.parametrize("lens_2d", [False, True])
def test_cuda_graph_replay_after_the_lengths_change(variant, lens_2d):
    inp = fp4_inputs(2, 64, 32, [900, 5, 70, 333], lens_2d, seed=9)
    config = {"variant": NAME}
    run_op(inp, True, backend="gluon", config=config)  # warm-up: compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_mqa_logits.paged_mqa_logits(*positional(inp), q_scale=inp["q_scale"], clean_logits=True,
                                          backend="gluon", config=config)
    inp["context_lens"].copy_(lengths_like(inp, [640, 0, 1, 333]))
    inp["out_logits"].fill_(float("nan"))
    before = inp["out_logits"].clone()
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(inp, before, reference_of(inp), True, f"graph replay, lens_2d={lens_2d}")
