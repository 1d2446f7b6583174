"""The op's own ``clean_logits`` pass (backends/clean_tail.py): ``-inf`` over each row's tail,
nothing else touched; the same kernel on CPU (Triton interpreter) and on a GPU."""

import dataclasses
import os
import sys

import pytest
import torch

from paged_mqa_logits import op
from paged_mqa_logits.backends import clean_tail as ct
from paged_mqa_logits.reference import make_inputs
from paged_mqa_logits.validate import build_launch_args

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from op_cases import positional  # noqa: E402

SENTINEL = 7.0


def _args(lens, next_n, lens_2d, dtype, max_model_len, device="cpu"):
    inp = make_inputs(len(lens), next_n, 16, lens, kv_block_size=16, lens_2d=lens_2d, max_model_len=max_model_len,
                      logits_dtype=dtype, device=device, out_fill=SENTINEL)
    return build_launch_args(*positional(inp))


def _expected(args):
    """The masked fill the op uses on CPU tensors, on a CPU copy of what it reads."""
    copy = dataclasses.replace(args, out=args.out.clone().cpu(), context_lens=args.context_lens.cpu())
    op.clean(copy)
    return copy.out


CASES = [  # lens, next_n, 2-D lengths, logits dtype, max_model_len
    ([50, 3, 0, 2100], 1, True, torch.float32, 2100),
    ([50, 3, 0, 2100], 3, True, torch.bfloat16, 2500),
    ([50, 3, 1, 17], 2, False, torch.float32, 3000),
    ([2048] * 3, 4, True, torch.float32, 2048),  # uniform: only the last rows' short tails
]


@pytest.mark.parametrize("lens,next_n,lens_2d,dtype,max_model_len", CASES)
def test_the_tail_kernel_writes_each_rows_tail_and_nothing_else(lens, next_n, lens_2d, dtype, max_model_len):
    args = _args(lens, next_n, lens_2d, dtype, max_model_len)
    expected = _expected(args)
    ct.clean_tail(args)  # CPU tensors: the interpreter runs the kernel
    assert torch.equal(args.out, expected)
    assert (args.out[:, max_model_len:] == SENTINEL).all()  # the padding past max_model_len untouched
    assert torch.isinf(expected).any() and (expected == SENTINEL).any()


def test_a_row_split_over_several_programs_covers_its_whole_tail(monkeypatch):
    """One row with a long tail: several programs share it (block by block, interleaved)."""
    monkeypatch.setattr(ct, "BLOCK", 64)
    args = _args([5], 1, True, torch.float32, 1000)
    ct.clean_tail(args)
    assert (args.out[0, 5:1000] == float("-inf")).all() and (args.out[0, :5] == SENTINEL).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
@pytest.mark.parametrize("lens,next_n,lens_2d,dtype,max_model_len", CASES)
def test_the_tail_kernel_on_a_gpu_matches_the_masked_fill_and_replays_in_a_graph(lens, next_n, lens_2d, dtype,
                                                                                   max_model_len):
    args = _args(lens, next_n, lens_2d, dtype, max_model_len, device="cuda")
    expected = _expected(args)
    ct.clean_tail(args)
    torch.cuda.synchronize()
    assert torch.equal(args.out.cpu(), expected)
    args.out.fill_(SENTINEL)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ct.clean_tail(args)
    args.out.fill_(SENTINEL)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(args.out.cpu(), expected)
