"""The portable Triton kernel, run on CPU tensors through the Triton interpreter (and on a GPU
when one is present), against the reference over the randomised matrix."""

import pytest
import torch

from op_cases import build, random_case, run_and_check
from paged_mqa_logits import paged_mqa_logits
from paged_mqa_logits.backends import get
from paged_mqa_logits.reference import make_inputs
from op_cases import positional

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(14))
def test_random_matrix(seed, device):
    case = random_case(500 + seed, heads=(16, 32, 64), max_context=200, max_batch=2)
    check = run_and_check(paged_mqa_logits, build(case, device=device), backend="triton")
    assert check.ok, f"{case}: {check.describe()}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", [
    {"ChunkK": 32, "SplitKV": 1}, {"ChunkK": 128, "SplitKV": 3, "RowsPerProgram": 2},
    {"ChunkK": 64, "SplitKV": 0, "RowsPerProgram": 1}, {"ChunkK": 64, "RowsPerProgram": 8},
])
def test_knobs(config, device):
    inp = make_inputs(2, 3, 32, [150, 61], kv_block_size=16, preshuffle=True, max_model_len=160, device=device, seed=4)
    check = run_and_check(paged_mqa_logits, inp, backend="triton", config=config)
    assert check.ok, check.describe()


def test_bit_identical_1d_2d_under_interpreter():
    a = make_inputs(2, 2, 32, [70, 33], kv_block_size=32, lens_2d=False, seed=9)
    b = make_inputs(2, 2, 32, [70, 33], kv_block_size=32, lens_2d=True, seed=9)
    paged_mqa_logits(*positional(a), backend="triton")
    paged_mqa_logits(*positional(b), backend="triton")
    assert torch.equal(a["out_logits"].view(torch.int32), b["out_logits"].view(torch.int32))


def test_candidates_cover_knobs():
    backend = get("triton")
    from paged_mqa_logits.explain import explain  # noqa: F401  (problem construction lives there)
    from paged_mqa_logits.problem import Problem

    p = Problem("sm_90", 132, 8, 2, 64, 128, 64, False, None, True, "fn", "cuda", 8192)
    cands = backend.candidates(p)
    assert {c["ChunkK"] for c in cands} == {64, 128}
    assert {c["RowsPerProgram"] for c in cands} == {1, 2}  # never more rows than next_n (2)
    assert all(set(c) == {"ChunkK", "SplitKV", "RowsPerProgram", "num_warps", "num_stages"} for c in cands)
    assert backend.unsupported(p) is None
    assert "power of two" in backend.unsupported(Problem("sm_90", 132, 8, 2, 48, 128, 64, False, None, True, "fn", "cuda", 8192))
