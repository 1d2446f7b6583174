"""The register-MMA body's ``HEAD_SUM`` path (``kernels/register_mma.py``; the gfx950 ``mfma``
variant's ``HeadSum=tensor``) on an sm_90 GPU: the ``mma_v2`` atoms with the twin head-sum atom
``kernels/mma_v2.py: mma_bf16_head_sum`` (the same packed-int16 ReLU of bf16-rounded scores
and hi/lo weight rows as the AMD atom, ``relu_bf16`` / ``weight_rows``, in a bf16 ``mma_v2``
product). Every case holds the contract's bound per logit,

    |ours - exact| <= 2^-8 * scale * sum_h |w_h| relu(s_h)

and a calc_diff of at most 1e-5 against the fp32 reference, and leaves every position a row does
not see untouched: 8 shapes (next_n 1/2/3/4/5/8, 32 and 64 heads, blocks 1-256, 1-D and 2-D lengths, fp32
and bf16 logits), each with a candidate walked through the list (Q staged in LDS), a Q-in-registers
candidate on a 3-way split grid with the two-tile loop, and the default config, on adversarial
weights and key scales. Skipped without an sm_90 GPU.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from paged_mqa_logits.reference import make_inputs
from test_gluon_gpu import launch_args, variant_module
from test_headsum_gpu import _adversarial, _check_bound

pytestmark = pytest.mark.gpu

#: (heads, next_n, kv_block_size, lens_2d, logits dtype)
CASES = ((64, 1, 64, True, torch.float32), (64, 2, 16, False, torch.float32), (64, 4, 1, True, torch.float32),
         (32, 3, 256, False, torch.float32), (32, 8, 64, True, torch.float32), (64, 5, 32, True, torch.float32),
         (32, 1, 128, True, torch.bfloat16), (64, 4, 64, False, torch.bfloat16))


@pytest.mark.parametrize("heads,next_n,kv_block_size,lens_2d,dtype", CASES)
@pytest.mark.parametrize("pick", range(3))
def test_tensor_head_sum_on_the_register_mma_twin(heads, next_n, kv_block_size, lens_2d, dtype, pick):
    module = variant_module("mma_v2")
    from paged_mqa_logits.backends.gluon import common
    from paged_mqa_logits.backends.gluon.kernels.mma_v2 import mma_bf16_head_sum

    rng = random.Random(heads * 31 + next_n * 7 + kv_block_size + pick)
    lens = [rng.choice((0, 1, 63, 65, rng.randint(1, 1500))) for _ in range(6)]
    lens[0] = 1500
    inp = make_inputs(6, next_n, heads, lens, kv_block_size=kv_block_size, device="cuda", seed=pick + next_n,
                      max_model_len=1600, out_row_pad=1, table_row_pad=1, lens_2d=lens_2d, logits_dtype=dtype)
    _adversarial(inp, torch.Generator().manual_seed(pick))
    args = launch_args(inp)
    p = args.problem
    candidates = module.candidates(p)
    register_q = [c for c in candidates if not c["QInLDS"]]
    # a staged-Q candidate, a Q-in-registers one (the two-tile loop on a split grid), the default
    configs = [candidates[(pick * 5) % len(candidates)],
               dict(register_q[pick % len(register_q)], SplitKV=3) if register_q else candidates[-1],
               module.default_config(p)]
    config = configs[pick]
    prefetch = 2 if pick == 1 and register_q else None
    grid, splits = module.program_grid(p, config)
    fp32_kwargs = dict(module.constexprs(p, config), **module.options(p, config))
    if prefetch:
        fp32_kwargs["PREFETCH"] = prefetch
    tensor_kwargs = dict(fp32_kwargs, HEAD_SUM=mma_bf16_head_sum)
    assert fp32_kwargs["HEAD_SUM"] is not mma_bf16_head_sum  # the comparison is the fp32 head sum
    before = inp["out_logits"].clone()
    # the same kernel and config with its fp32 head sum first, into a copy: the bound is the head
    # sum's own error, over the scores both share
    fp32 = before.clone()
    module.kernel_for(fp32_kwargs)[grid](*common.kernel_arguments(dataclasses.replace(args, out=fp32), splits),
                                          **fp32_kwargs)
    module.kernel_for(tensor_kwargs)[grid](*common.kernel_arguments(args, splits), **tensor_kwargs)
    torch.cuda.synchronize()
    _check_bound(inp, inp["out_logits"], before, fp32, clean_logits=False)
