"""What only the ``wgmma_pipes`` kernel does, on an H200 (the rest of its matrix runs in
test_gluon_gpu.py and test_schedule_gpu.py with the other variants): ``clean_logits`` written
by the kernel itself (``-inf`` over the positions a row does not see, in its tiles and in the
tail past them up to ``max_model_len``) for every team shape, overlapped consumers or not, both
schedules, TMA and gathered keys, every block size and 2-D lengths that differ per row; and the
op using it instead of its own cleaning pass.

Skipped (with the reason printed) without an sm_90 GPU.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from paged_mqa_logits import op
from paged_mqa_logits.backends.gluon import BACKEND
from paged_mqa_logits.reference import check_logits, make_inputs, reference_logits
from test_gluon_gpu import launch_args, variant_module

pytestmark = pytest.mark.gpu

#: (Consumers, RowSplit, CtasPerSM, RowsPerMMA, num_stages, KeyCopy, Schedule, Overlap)
TEAMS = (
    (4, 1, 1, 1, 3, "tma", "balanced", 0),
    (4, 2, 1, 1, 4, "tma", "balanced", 0),
    (2, 1, 1, 2, 4, "gather", "balanced", 0),
    (4, 1, 1, 1, 3, "tma", "split", 0),
    (1, 1, 2, 2, 4, "tma", "split", 0),
    # overlapped consumers: each team's tiles two to a loop step, an odd or even count left over
    (2, 1, 1, 2, 4, "tma", "balanced", 1),
    (2, 2, 1, 2, 4, "tma", "balanced", 1),
    (2, 1, 1, 2, 3, "gather", "split", 1),
    (4, 1, 1, 2, 3, "tma", "balanced", 1),
)


def _config(index: int) -> dict:
    consumers, split, ctas, rows, stages, key_copy, schedule, overlap = TEAMS[index]
    return {"variant": "wgmma_pipes", "Consumers": consumers, "RowSplit": split, "CtasPerSM": ctas,
            "RowsPerMMA": rows, "num_stages": stages, "KeyCopy": key_copy, "Schedule": schedule, "Overlap": overlap}


def _independent_rows(inp: dict, rng: random.Random) -> None:
    """2-D lengths that differ per row in any order (each within its sequence's keys): the
    longest row sizes the sequence's work, the others see less."""
    lens = inp["context_lens"]
    capacity = lens.max(dim=1).values.tolist()
    rows = [[rng.randint(0, cap) for _ in range(lens.shape[1])] for cap in capacity]
    lens.copy_(torch.tensor(rows, dtype=torch.int32, device=lens.device))


@pytest.mark.parametrize("team", range(len(TEAMS)))
@pytest.mark.parametrize("kv_block_size", (16, 32, 64, 128))
@pytest.mark.parametrize("heads,next_n", ((64, 2), (64, 4), (32, 3), (32, 1)))
def test_kernel_cleans_logits(team, kv_block_size, heads, next_n):
    module = variant_module("wgmma_pipes")
    rng = random.Random(team * 1000 + kv_block_size + next_n)
    lens = [rng.choice((0, 1, rng.randint(1, 3000))) for _ in range(19)]
    lens[0] = 3000
    inp = make_inputs(19, next_n, heads, lens, kv_block_size=kv_block_size, device="cuda", seed=team,
                      max_model_len=3000 + 700, out_row_pad=2, table_row_pad=1, block_stride_pad=16 * (team % 2))
    _independent_rows(inp, rng)
    args = launch_args(inp)
    config = _config(team)
    if not module.admits(args.problem, config):
        pytest.skip(f"{config} does not fit {args.problem.describe()}")
    inp["out_logits"].fill_(float("nan"))
    before = inp["out_logits"].clone()
    assert BACKEND.writes_tails(args.problem, config)
    module.launch(dataclasses.replace(args, clean_logits=True), config)
    torch.cuda.synchronize()
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                           inp["max_model_len"], kv_block_size=kv_block_size)
    check = check_logits(inp["out_logits"], before, ref, clean_logits=True)
    assert check.ok, f"{config}: {check.describe()}"


def test_without_clean_logits_the_tail_is_untouched():
    """The same kernel with the flag off writes only the visible positions."""
    module = variant_module("wgmma_pipes")
    inp = make_inputs(5, 2, 64, [700, 0, 65, 1, 300], kv_block_size=64, device="cuda", seed=3, max_model_len=2000)
    args = launch_args(inp)
    before = inp["out_logits"].clone()
    module.launch(args, _config(0))
    torch.cuda.synchronize()
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                           inp["max_model_len"], kv_block_size=64)
    check = check_logits(inp["out_logits"], before, ref)
    assert check.ok, check.describe()


def test_the_op_lets_the_kernel_clean(monkeypatch):
    """``clean_logits=True`` through the op with a fused kernel runs no second pass."""
    variant_module("wgmma_pipes")

    def second_pass(args):
        raise AssertionError("the op cleaned after a kernel that cleans")

    monkeypatch.setattr(op, "clean", second_pass)
    inp = make_inputs(6, 2, 64, [900, 0, 5, 64, 333, 1], kv_block_size=32, device="cuda", seed=9, max_model_len=1500)
    before = inp["out_logits"].clone()
    op.paged_mqa_logits_eager(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"], inp["context_lens"],
                              inp["kv_indices"], inp["max_model_len"], False, 32, clean_logits=True, backend="gluon",
                              config=_config(0))
    torch.cuda.synchronize()
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                           inp["max_model_len"], kv_block_size=32)
    check = check_logits(inp["out_logits"], before, ref, clean_logits=True)
    assert check.ok, check.describe()
