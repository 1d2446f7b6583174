"""The sm_90 ``wgmma_fp4`` variant (backends/gluon/wgmma_fp4.py) on an H200, against the exact
MXFP4 reference (``reference.reference_logits`` with ``q_scale``): ``calc_diff < 5e-6`` on every
visible position, every other position untouched bit for bit (``-inf`` where ``clean_logits``
asks for it).

Matrix: next_n 1-4 x KVBlockSize 32/64 (and next_n 5-8 with the default config), heads 32 and 64
across them, 1-D and 2-D lengths, ragged lengths with a zero-length sequence and one shorter
than next_n (zero-length rows), padded block strides and table / output rows; fp32 logits with
the default config, and in four cases a candidate (walking ChunkK, RowsPerMMA, both schedules);
bf16 logits with the default once per next_n; ``clean_logits`` off and on. KVBlockSize
1/16/128/256 with the default config (a block stride not 16-byte aligned among them). Then
through the public op (forced to the variant, and left to the dispatcher, which must pick it),
and a CUDA graph replayed after the lengths changed in place. Every distinct kernel compiles on
first use: the matrix is sized for about a minute on the H200. Skipped without an sm_90 GPU.
Run: ``python -m pytest -q -m gpu tests/backends/gluon/test_wgmma_fp4_gpu.py``.
"""

from __future__ import annotations

import os
import sys

import pytest

from paged_mqa_logits import dispatch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp4_gpu_checks import (assert_matches, check_bf16_logits, check_configs, check_forced_by_name,  # noqa: E402
                            check_graph_replay, fp4_inputs, launch_args, reference_of, run_op, sm90_variant)

pytestmark = pytest.mark.gpu

NAME = "wgmma_fp4"
#: (next_n, kv_block_size): heads alternate between 32 and 64, and so do 1-D / 2-D lengths
CASES = tuple((next_n, bs) for next_n in (1, 2, 3, 4) for bs in (32, 64))
#: the cases that also run a candidate (ChunkK, RowsPerMMA and the schedules walked across them)
WALKED = (1, 4, 6, 7)


@pytest.fixture(scope="module")
def variant():
    return sm90_variant(NAME)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_against_the_exact_reference(variant, case):
    next_n, bs = CASES[case]
    heads = 64 if (next_n + bs // 32) % 2 else 32
    lens = [515 + 37 * next_n, 0, 129 + bs, next_n - 1, 64]
    inp = fp4_inputs(next_n, bs, heads, lens, case % 2 == 0, seed=70 + case, block_stride_pad=16, table_row_pad=1,
                     out_row_pad=2)
    problem = launch_args(inp).problem
    assert variant.unsupported(problem) is None
    ref = reference_of(inp)
    candidates = variant.candidates(problem)
    walked = case in WALKED and bool(candidates)
    check_configs(inp, ref, [variant.default_config(problem)] + [candidates[(case * 3 + 1) % len(candidates)]] * walked,
                  case)
    if bs == 64:  # bf16 logits: once per next_n (each case's kernels compile anew: keep the run short)
        check_bf16_logits(variant, inp, ref)


@pytest.mark.parametrize("next_n", [5, 6, 7, 8])
def test_next_n_past_four(variant, next_n):
    """The row groups of next_n 5-8 (uneven ones at 5-7), the default config, 1-D / 2-D lengths."""
    heads = 64 if next_n % 2 else 32
    inp = fp4_inputs(next_n, 64, heads, [400 + 29 * next_n, 0, next_n - 2, 130], next_n % 2 == 0, seed=next_n)
    problem = launch_args(inp).problem
    check_configs(inp, reference_of(inp), [variant.default_config(problem)] * 2, next_n)


@pytest.mark.parametrize("bs", [1, 16, 128, 256])
def test_other_block_sizes(variant, bs):
    """The block sizes past 32/64 it serves (the same per-token page lookup), default config."""
    lens = [300 + bs, 0, 77]
    inp = fp4_inputs(2, bs, 64, lens, bs % 32 == 0, seed=bs, block_stride_pad=4 * (bs == 16))
    ref = reference_of(inp)
    for clean in (False, True):
        before = run_op(inp, clean, backend="gluon", config={"variant": NAME})
        assert_matches(inp, before, ref, clean, f"KVBlockSize {bs}, clean_logits={clean}")


def test_forced_by_name_with_every_other_knob_defaulted(variant):
    check_forced_by_name(NAME)


def test_the_dispatcher_picks_it_and_the_public_op_runs_it(variant):
    from paged_mqa_logits.backends.gluon import BACKEND

    inp = fp4_inputs(3, 64, 64, [700, 3, 0, 260], False, seed=5)  # the shape of the forced test
    problem = launch_args(inp).problem
    choice = dispatch.choose(problem)
    assert choice.backend == "gluon", choice
    assert BACKEND.variant(problem, choice.config) is variant, choice
    ref = reference_of(inp)
    for clean in (False, True):
        before = run_op(inp, clean)  # the dispatcher's pick
        assert_matches(inp, before, ref, clean, f"dispatched, clean_logits={clean}")


@pytest.mark.parametrize("lens_2d", [False, True])
def test_cuda_graph_replay_after_the_lengths_change(variant, lens_2d):
    check_graph_replay(NAME, lens_2d)
