"""Bad keyword options and tensors raise PagedMQAArgumentError naming the argument, alike on
the direct eager path and through the registered op."""

import pytest
import torch

from op_cases import positional
from paged_mqa_logits import PagedMQAArgumentError, torch_op
from paged_mqa_logits.reference import make_inputs


def inputs():
    return make_inputs(2, 2, 32, [40, 17], kv_block_size=16, max_model_len=48)


@pytest.fixture(params=["direct", "via_op"])
def route(request, monkeypatch):
    monkeypatch.setattr(torch_op, "EAGER_VIA_OP", request.param == "via_op")
    return request.param


@pytest.mark.parametrize("options,argument,given", [
    ({"backend": "nope"}, "backend", "'nope'"),
    ({"clean_logits": "no"}, "clean_logits", "'no'"),
    ({"clean_logits": 1}, "clean_logits", "1"),
    ({"context_hint": -1}, "context_hint", "-1"),
    ({"context_hint": 12.5}, "context_hint", "float"),
    ({"config": {"ChunkK": 64}}, "config", "a config without a backend"),
    ({"backend": "triton", "config": {"ChunkK": 3}}, "config", "triton knob ChunkK=3: expected one of"),
    ({"backend": "triton", "config": {"ChunkK": 64.9}}, "config", "ChunkK=64.9"),
])
def test_bad_options_raise_the_same_on_every_route(route, options, argument, given):
    inp = inputs()
    with pytest.raises(PagedMQAArgumentError) as err:
        torch_op.paged_mqa_logits(*positional(inp), **options)
    assert f"`{argument}`" in str(err.value) and given in str(err.value), str(err.value)
    assert not torch.isfinite(inp["out_logits"]).any()


def test_unknown_backend_through_the_raw_op():
    inp = inputs()
    with pytest.raises(PagedMQAArgumentError, match="`backend`: expected None or one of 'torch'"):
        torch_op.op(*positional(inp), backend="nope")


def test_meta_tensors_are_rejected():
    inp = inputs()
    meta = {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}
    with pytest.raises(PagedMQAArgumentError, match="`q_fp8`: expected tensors with data .*, got meta tensors"):
        torch_op.paged_mqa_logits(*positional(meta))
