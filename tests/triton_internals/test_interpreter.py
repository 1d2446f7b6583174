"""Interpreter twins (paged_mqa_logits/triton_internals/interpreter.py): a ``@triton.jit``
kernel runs on CPU tensors with the GPUs' float semantics, and Triton's language module is
left as it was for the GPU compiles of the same process."""

import math

import torch

from kernels import max_kernel
from paged_mqa_logits.triton_internals.interpreter import interpreted


def test_a_twin_runs_on_cpu_with_gpu_maxnum_and_leaves_triton_language_alone():
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    members = {name: value for name, value in vars(tl).items()}
    x = torch.tensor([math.nan, 1.0, -3.0, 5.0])
    y = torch.tensor([2.0, math.nan, -4.0, 6.0])
    out = torch.full((5,), -1.0)
    twin = interpreted(max_kernel)
    assert interpreted(max_kernel) is twin
    twin[(1,)](x, y, out, N=4)
    assert out[:4].tolist() == [2.0, 1.0, -3.0, 6.0]  # IEEE maxNum: a NaN operand yields the other
    assert isinstance(tl.max, JITFunction) and vars(tl) == members
