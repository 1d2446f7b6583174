"""One float rule for every path: ``scale * sum_h w * relu(dot)`` in fp32, relu = IEEE maxNum
(a NaN dot contributes 0), everything else by IEEE rules. The torch reference and the Triton
kernel (interpreted on CPU, with the GPUs' maxNum and fp8-NaN conversion) agree bit for bit on
where the NaNs and infinities are."""

import pytest
import torch

from op_cases import positional
from paged_mqa_logits import paged_mqa_logits
from paged_mqa_logits.reference import make_inputs


def scales_of(kv):
    return kv.as_strided((kv.shape[0], 16 * 4), (kv.stride(0), 1), kv.storage_offset() + 16 * 128).view(torch.float32)


def nan_in_q(inp):
    q = inp["q_fp8"].view(torch.uint8).clone()
    q[0, 0, 3, 5] = 0x7F  # e4m3fn NaN
    inp["q_fp8"] = q.view(torch.float8_e4m3fn)


def nan_in_key(inp):
    inp["kv_cache"][:, 2, 0, 7] = 0xFF  # token 2 of every block: a NaN key byte


def nan_weight(inp):
    inp["weights"][0, 3] = float("nan")


def odd_scales(inp):
    s = scales_of(inp["kv_cache"])
    s[:, 1], s[:, 2], s[:, 4] = float("nan"), float("inf"), -1.0


@pytest.mark.parametrize("change", [nan_in_q, nan_in_key, nan_weight, odd_scales])
def test_torch_and_triton_agree_on_non_finite_inputs(change):
    inp = make_inputs(1, 1, 16, [20], kv_block_size=16, max_model_len=24)
    change(inp)
    outs = []
    for backend in ("torch", "triton"):
        out = torch.zeros(1, 32)
        paged_mqa_logits(*positional(dict(inp, out_logits=out)), backend=backend)
        outs.append(out)
    ref, got = outs
    assert torch.equal(ref.isnan(), got.isnan()) and torch.equal(ref.isinf(), got.isinf())
    finite = ref.isfinite()
    assert torch.allclose(ref[finite], got[finite], rtol=1e-4, atol=1e-3)
    if change is nan_in_q:  # the NaN dot of head 3 contributes 0: every logit stays finite
        assert ref[0, :20].isfinite().all()
    if change is odd_scales:
        assert ref[0, 1].isnan() and (ref[0, 2].isinf() or ref[0, 2].isnan())
