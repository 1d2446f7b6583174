"""Every layout validation accepts is served by every backend that does not declare it
unsupported: the strides of size-1 cache dimensions address nothing and may be anything."""

import pytest
import torch

from op_cases import positional
from paged_mqa_logits import PagedMQAArgumentError, paged_mqa_logits
from paged_mqa_logits.reference import check_logits, make_inputs, reference_logits


def odd_dim2(kv):
    return kv.as_strided(kv.shape, (kv.stride(0), kv.stride(1), 7, 1), kv.storage_offset())


def odd_dims_1_2(kv):  # KVBlockSize 1: dim 1 has size 1 too
    return kv.as_strided(kv.shape, (kv.stride(0), 3, 5, 1), kv.storage_offset())


def odd_single_block(kv):
    return kv.as_strided(kv.shape, (3, kv.stride(1), kv.stride(2), 1), kv.storage_offset())


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("relayout,kv_block_size,lens", [(odd_dim2, 16, [20, 5]), (odd_dims_1_2, 1, [20, 5]),
                                                      (odd_single_block, 16, [9])])
def test_size_one_strides_are_served(backend, relayout, kv_block_size, lens):
    inp = make_inputs(len(lens), 1, 16, lens, kv_block_size=kv_block_size)
    inp["kv_cache"] = relayout(inp["kv_cache"])
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                           inp["max_model_len"], kv_block_size=kv_block_size)
    before = inp["out_logits"].clone()
    paged_mqa_logits(*positional(inp), backend=backend)
    assert check_logits(inp["out_logits"], before, ref).ok


def test_fnuz_on_cpu_is_declared_unsupported_by_triton():
    inp = make_inputs(2, 1, 16, [20, 5], kv_block_size=16, fp8_dtype=torch.float8_e4m3fnuz)
    with pytest.raises(PagedMQAArgumentError, match="`backend`: 'triton' cannot serve this call: .*e4m3fnuz"):
        paged_mqa_logits(*positional(inp), backend="triton")
    paged_mqa_logits(*positional(inp))  # dispatched: the torch backend serves it
    assert torch.isfinite(inp["out_logits"][:, :20]).any()
