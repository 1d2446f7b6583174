"""bf16 logits from every gluon variant on a GPU: the kernel computes and sums heads in fp32 as
for fp32 logits and rounds once, at the store (``cvt.rn``: to nearest even, as torch does).

Each case launches the same config twice through the op, into an fp32 and into a bf16 output,
with ``clean_logits`` off and on, and requires of the bf16 output:

* every logit is the fp32 kernel's logit rounded to bf16, bit for bit up to one bf16 ulp (the
  two are separately compiled kernels; the ulp leaves room for a different fp32 rounding);
* it is as close to the exact reference rounded once to bf16 as the fp32 kernel's own logits
  rounded are, up to one ulp;
* ``-inf`` exactly where the fp32 output has it (``clean_logits``), every other position
  untouched bit for bit (``reference.check_logits``).

Matrix, per variant: next_n 1-4 x KVBlockSize 32/64, each next_n and block size with 1-D and
2-D lengths, a zero-length sequence, padded block strides and table rows; the variant's default
config and one candidate walked across the cases (row groups, key copies, overlap, schedules).
sm_90 runs ``mma_v2``, ``wgmma``, ``wgmma_ws``, ``wgmma_pipes``; ROCm runs ``mfma``.
Skipped (with the reason printed) without a GPU.
"""

from __future__ import annotations

import pytest
import torch

from op_cases import positional
from paged_mqa_logits import op
from paged_mqa_logits.reference import check_logits, make_inputs, reference_logits
from test_gluon_gpu import ALL_VARIANTS, device_arch, fp8_dtype, launch_args, variant_module

pytestmark = pytest.mark.gpu

#: (next_n, kv_block_size, lens_2d): every next_n and block size with both kinds of lengths
CASES = tuple((next_n, bs, (next_n % 2 == 0) != (bs == 64)) for next_n in (1, 2, 3, 4) for bs in (32, 64))


def ordered_bits(x: torch.Tensor) -> torch.Tensor:
    """bf16 values as integers in value order (adjacent bf16 values differ by 1; +0 == -0)."""
    bits = x.view(torch.int16).to(torch.int32)
    return torch.where(bits < 0, -(bits & 0x7FFF), bits)


def ulps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (ordered_bits(a) - ordered_bits(b)).abs()


def run_op(inp: dict, out: torch.Tensor, config: dict, clean: bool) -> torch.Tensor:
    """``out`` (NaN-filled first) after the op ran ``config`` on ``inp``; a copy of it before."""
    out.fill_(float("nan"))
    before = out.clone()
    op.paged_mqa_logits_eager(*positional(dict(inp, out_logits=out)), clean_logits=clean, backend="gluon",
                              config=config)
    torch.cuda.synchronize()
    return before


def assert_rounded_once(config: dict, inp: dict, clean: bool, ref: torch.Tensor, ref_bf16: torch.Tensor) -> None:
    fp32 = inp["out_logits"]
    bf16 = torch.empty_like(fp32, dtype=torch.bfloat16)
    run_op(inp, fp32, config, clean)
    before = run_op(inp, bf16, config, clean)
    what = f"{config} clean_logits={clean}"
    check = check_logits(bf16, before, ref, clean_logits=clean)
    assert check.ok, f"{what}: {check.describe()}"
    rounded = fp32.to(torch.bfloat16)
    nan = torch.isnan(rounded)
    assert torch.equal(torch.isnan(bf16), nan), what
    finite = torch.isfinite(rounded)
    assert torch.equal(bf16[~finite & ~nan], rounded[~finite & ~nan]), f"{what}: -inf positions differ"
    apart = ulps_apart(bf16[finite], rounded[finite])
    assert int(apart.max()) <= 1, f"{what}: {int((apart > 0).sum())} logits differ, up to {int(apart.max())} ulps"
    visible = torch.isfinite(ref)
    rows, width = ref.shape
    got, own = bf16[:rows, :width][visible], rounded[:rows, :width][visible]
    slack = ulps_apart(own, ref_bf16[visible]) + 1
    assert bool((ulps_apart(got, ref_bf16[visible]) <= slack).all()), f"{what}: farther from the reference"


@pytest.mark.parametrize("name", ALL_VARIANTS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_bf16_logits_are_the_fp32_logits_rounded_once(name, case):
    module = variant_module(name)
    next_n, bs, lens_2d = CASES[case]
    heads = 64 if next_n <= 2 else 32
    lens = [515 + 37 * next_n, 0, 129 + bs]
    inp = make_inputs(3, next_n, heads, lens, kv_block_size=bs, lens_2d=lens_2d, device="cuda",
                      fp8_dtype=fp8_dtype(device_arch()), seed=40 + case, max_model_len=max(lens) + 40,
                      out_row_pad=2, table_row_pad=1, block_stride_pad=16)
    problem = launch_args(inp).problem
    refs = [reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                             inp["max_model_len"], kv_block_size=bs, logits_dtype=dtype)
            for dtype in (torch.float32, torch.bfloat16)]
    candidates = module.candidates(problem)
    configs = [module.default_config(problem)] + [candidates[(case * 5 + 3) % len(candidates)]] * bool(candidates)
    for config in configs:
        for clean in (False, True):
            assert_rounded_once(config, inp, clean, *refs)
