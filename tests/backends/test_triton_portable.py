"""The portable Triton kernel, run on CPU tensors through the Triton interpreter (and on a GPU
when one is present), against the reference over the randomised matrix."""

import random

import pytest
import torch

from op_cases import build, random_case, run_and_check
from paged_mqa_logits import PagedMQAArgumentError, paged_mqa_logits
from paged_mqa_logits.backends import get
from paged_mqa_logits.problem import Problem, ShapeKey
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


def _key(heads: int) -> ShapeKey:
    return ShapeKey(heads=heads, head_dim=128, kv_block_size=64, preshuffle=False, batch=8, next_n=2)


def test_candidates_cover_knobs():
    backend = get("triton")
    from paged_mqa_logits.explain import explain  # noqa: F401  (problem construction lives there)

    p = Problem("sm_90", 132, _key(64), None, True, "fn", 8192)
    cands = backend.candidates(p)
    assert {c["ChunkK"] for c in cands} == {64, 128}
    assert {c["RowsPerProgram"] for c in cands} == {1, 2}  # never more rows than next_n (2)
    assert all(set(c) == {"ChunkK", "SplitKV", "RowsPerProgram", "num_warps", "num_stages", "Schedule"} for c in cands)
    assert backend.unsupported(p) is None
    assert "power of two" in backend.unsupported(Problem("sm_90", 132, _key(48), None, True, "fn", 8192))


@pytest.mark.parametrize("next_n, lens_2d, rows", [(1, True, 1), (3, False, 2), (5, True, 8), (7, False, 4)])
def test_balanced_schedule_on_widely_ragged_batches(next_n, lens_2d, rows):
    """Zero-length rows between long ones, shares that end inside a sequence (CPU_PROGRAMS
    programs per row group), next_n 3/5/7 with row groups that do not divide next_n; the
    result is bit-identical to the per-sequence split (each logit is computed the same way)."""
    rng = random.Random(next_n)
    lens = [0 if b % 4 == 1 else rng.randint(1, 300) for b in range(9)]
    lens[0] = 300
    outs = []
    for schedule in ("balanced", "split"):
        inp = make_inputs(9, next_n, 16, lens, kv_block_size=16, lens_2d=lens_2d, seed=next_n, out_row_pad=1)
        check = run_and_check(paged_mqa_logits, inp, backend="triton",
                              config={"Schedule": schedule, "ChunkK": 32, "RowsPerProgram": rows})
        assert check.ok, f"{schedule}: {check.describe()}"
        outs.append(inp["out_logits"])
    assert torch.equal(outs[0].view(torch.int32), outs[1].view(torch.int32))


def test_schedule_knob_is_checked_and_both_are_candidates():

    backend = get("triton")
    p = Problem("sm_90", 132, _key(64), None, True, "fn", 8192)
    assert {c["Schedule"] for c in backend.candidates(p)} == {"balanced", "split"}
    assert backend.default_config(p)["Schedule"] == "split"
    inp = make_inputs(2, 1, 16, [40, 3], kv_block_size=16, seed=1)
    with pytest.raises(PagedMQAArgumentError, match="Schedule='round-robin': expected one of balanced, split"):
        paged_mqa_logits(*positional(inp), backend="triton", config={"Schedule": "round-robin"})
