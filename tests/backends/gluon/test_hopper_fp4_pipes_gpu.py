"""The sm_90 ``wgmma_fp4_pipes`` variant (backends/gluon/hopper_fp4_pipes.py) on an H200, against
the exact MXFP4 reference, exactly as ``wgmma_fp4`` is checked (fp4_gpu_checks.py: the inputs,
reference and comparison both tests share): ``calc_diff < 5e-6`` on every visible position, every other
position untouched bit for bit (``-inf`` where ``clean_logits`` asks for it).

Matrix: next_n 1-4 x KVBlockSize 32/64 (and next_n 5, 8 at 32 heads, default config), heads 32
and 64 across them, 1-D and 2-D lengths, ragged lengths with a zero-length sequence and one
shorter than next_n (zero-length rows), padded block strides and table / output rows; every
candidate of each case (both schedules, the team shapes, overlapped consumers where they fit),
``clean_logits`` alternating; bf16 logits once per next_n.
All forced through the public op (the variant is never the default). Then a
CUDA graph replayed after the lengths changed in place. Skipped without an sm_90 GPU.
Run: ``python -m pytest -q -m gpu tests/backends/gluon/test_hopper_fp4_pipes_gpu.py``.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp4_gpu_checks import (check_bf16_logits, check_configs, check_forced_by_name, check_graph_replay,  # noqa: E402
                            fp4_inputs, launch_args, reference_of, sm90_variant)

pytestmark = pytest.mark.gpu

NAME = "wgmma_fp4_pipes"
CASES = tuple((next_n, bs) for next_n in (1, 2, 3, 4) for bs in (32, 64))


@pytest.fixture(scope="module")
def variant():
    return sm90_variant(NAME, "hopper_fp4_pipes")


@pytest.mark.parametrize("case", range(len(CASES)))
def test_against_the_exact_reference(variant, case):
    next_n, bs = CASES[case]
    heads = 64 if (next_n + bs // 32) % 2 else 32
    # long enough for several tiles per team, a zero-length sequence, one shorter than next_n
    lens = [515 + 37 * next_n, 0, 129 + bs, next_n - 1, 64, 2000 + 61 * case]
    inp = fp4_inputs(next_n, bs, heads, lens, case % 2 == 0, seed=170 + case, block_stride_pad=16, table_row_pad=1,
                     out_row_pad=2)
    problem = launch_args(inp).problem
    assert variant.unsupported(problem) is None
    ref = reference_of(inp)
    check_configs(inp, ref, [variant.default_config(problem)] + variant.candidates(problem), case)
    if bs == 64:  # bf16 logits: once per next_n
        check_bf16_logits(variant, inp, ref)


@pytest.mark.parametrize("next_n", [5, 8])
def test_next_n_past_four(variant, next_n):
    """next_n 5 and 8 at 32 heads (64 heads past next_n 5 fits no team shape), default config."""
    inp = fp4_inputs(next_n, 64, 32, [1500 + 29 * next_n, 0, next_n - 2, 130], next_n % 2 == 0, seed=next_n)
    problem = launch_args(inp).problem
    check_configs(inp, reference_of(inp), [variant.default_config(problem)] * 2, next_n)


def test_forced_by_name_with_every_other_knob_defaulted(variant):
    check_forced_by_name(NAME)


@pytest.mark.parametrize("lens_2d", [False, True])
def test_cuda_graph_replay_after_the_lengths_change(variant, lens_2d):
    check_graph_replay(NAME, lens_2d)
