"""Each check of a call runs once, on every path a call takes: the option check
(``validate.check_options``) and the call's validation (``validate.build_launch_args``)."""

from collections import Counter

import pytest
import torch

from op_cases import positional
from paged_mqa_logits import torch_op, validate
from paged_mqa_logits.compat import aiter, deep_gemm
from paged_mqa_logits.reference import make_inputs

ONCE = {"check_options": 1, "build_launch_args": 1}


@pytest.fixture
def checks(monkeypatch):
    """Counts of the checks that ran (checks run while dynamo traces are compiling, not a call)."""
    seen = Counter()

    def counted(name, real):
        def check(*args, **kwargs):
            if not torch.compiler.is_compiling():
                seen[name] += 1
            return real(*args, **kwargs)
        return check

    for name in ONCE:
        monkeypatch.setattr(validate, name, counted(name, getattr(validate, name)))
    return seen


def inputs():
    return make_inputs(2, 2, 32, [40, 17], kv_block_size=16, max_model_len=48)


class Forwarding(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def eager(inp):
    torch_op.paged_mqa_logits(*positional(inp), context_hint=40, backend="torch", config={})


def via_op(inp, monkeypatch):
    monkeypatch.setattr(torch_op, "EAGER_VIA_OP", True)
    eager(inp)


def under_a_dispatch_mode(inp):
    with Forwarding():
        eager(inp)


def raw_op(inp):
    torch_op.op(*positional(inp), context_hint=40, backend="torch", config="{}")


def aiter_default(inp):
    aiter.deepgemm_fp8_paged_mqa_logits(*positional(inp))


def aiter_knobs(inp):
    aiter.deepgemm_fp8_paged_mqa_logits(*positional(inp), ChunkK=64)


def aiter_knobs_via_op(inp, monkeypatch):
    monkeypatch.setattr(torch_op, "EAGER_VIA_OP", True)
    aiter_knobs(inp)


def deep_gemm_call(inp):
    meta = deep_gemm.get_paged_mqa_logits_metadata(inp["context_lens"], inp["kv_block_size"], 4)
    deep_gemm.fp8_paged_mqa_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"],
                                   inp["kv_indices"], meta, inp["max_model_len"])


@pytest.mark.parametrize("path", [eager, via_op, under_a_dispatch_mode, raw_op, aiter_default, aiter_knobs,
                                  aiter_knobs_via_op, deep_gemm_call])
def test_each_check_runs_once_per_call(path, checks, monkeypatch):
    inp = inputs()
    if "monkeypatch" in path.__code__.co_varnames:
        path(inp, monkeypatch)
    else:
        path(inp)
    # DeepGEMM's entry allocates its result: it checks every input before it allocates (a bad
    # call costs no memory), and the op checks the call with the allocated result
    expected = dict(ONCE, build_launch_args=2) if path is deep_gemm_call else ONCE
    assert dict(checks) == expected


def test_each_check_runs_once_per_call_of_a_compiled_model(checks):
    inp = inputs()
    torch._dynamo.reset()

    def step(q, kv, w, out, lens, table):
        torch_op.paged_mqa_logits(q, kv, w, out, lens, table, inp["max_model_len"], False, 16, context_hint=40)
        return out

    compiled = torch.compile(step, fullgraph=True)
    compiled(*positional(inp)[:6])  # compiles, then runs
    checks.clear()
    compiled(*positional(inp)[:6])
    assert dict(checks) == ONCE
    torch._dynamo.reset()
