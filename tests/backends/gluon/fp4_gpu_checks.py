"""The sm_90 MXFP4 GPU checks of test_wgmma_fp4_gpu.py (``wgmma_fp4``): the variant lookup that skips without an
sm_90 GPU, fp4 inputs, the exact reference, and the checks: ``calc_diff < 5e-6`` on every visible
position against ``reference.reference_logits`` with ``q_scale``, every other position untouched
bit for bit (``-inf`` where ``clean_logits`` asks for it)."""

from __future__ import annotations

import pytest
import torch

import paged_mqa_logits
from paged_mqa_logits.op import build_launch_args
from paged_mqa_logits.reference import calc_diff, check_logits, make_inputs, reference_logits

MAX_DIFF = 5e-6


def _skip(reason: str):
    print(f"\nSKIP: {reason}")
    pytest.skip(reason)


def sm90_variant(name: str):
    """The Gluon variant ``name``, or a skip naming why it cannot run here."""
    if not torch.cuda.is_available():
        _skip(f"no CUDA GPU: the {name} kernel runs on sm_90 only")
    from paged_mqa_logits.arch import detect

    arch = detect("cuda").arch
    if arch != "sm_90":
        _skip(f"{name} targets sm_90, this GPU is {arch}")
    from paged_mqa_logits.backends.gluon import variants

    found = [v for v in variants() if v.name == name]
    assert found, f"no gluon variant named {name!r}"
    return found[0]


def fp4_inputs(next_n, bs, heads, lens, lens_2d, seed, logits_dtype=torch.float32, **kwargs) -> dict:
    return make_inputs(len(lens), next_n, heads, lens, kv_block_size=bs, lens_2d=lens_2d, device="cuda",
                       kv_format="fp4", seed=seed, max_model_len=max(lens) + 40, logits_dtype=logits_dtype, **kwargs)


def reference_of(inp: dict) -> torch.Tensor:
    return reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                            inp["max_model_len"], kv_block_size=inp["kv_block_size"], q_scale=inp["q_scale"])


def positional(inp: dict) -> tuple:
    return (inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"], inp["context_lens"], inp["kv_indices"],
            inp["max_model_len"], False, inp["kv_block_size"])


def launch_args(inp: dict):
    return build_launch_args(*positional(inp), q_scale=inp["q_scale"])


def assert_matches(inp: dict, before: torch.Tensor, ref: torch.Tensor, clean: bool, what: str) -> None:
    out = inp["out_logits"]
    check = check_logits(out, before, ref, clean_logits=clean)
    assert check.untouched, f"{what}: positions outside the visible ones changed ({check.describe()})"
    visible = torch.isfinite(ref)
    rows, width = ref.shape
    got = out[:rows, :width][visible].float()
    assert not bool(torch.isnan(got).any()), f"{what}: NaN at visible positions"
    diff = calc_diff(got, ref[visible].float())
    assert diff < MAX_DIFF, f"{what}: calc_diff {diff:.3g} >= {MAX_DIFF}"


def run_op(inp: dict, clean: bool, **kwargs) -> torch.Tensor:
    """``out_logits`` NaN-filled, then the public op on ``inp``; returns the copy from before."""
    inp["out_logits"].fill_(float("nan"))
    before = inp["out_logits"].clone()
    paged_mqa_logits.paged_mqa_logits(*positional(inp), q_scale=inp["q_scale"], clean_logits=clean, **kwargs)
    torch.cuda.synchronize()
    return before


def check_configs(inp: dict, ref: torch.Tensor, configs: list[dict], case: int) -> None:
    """Each config forced through the public op, ``clean_logits`` alternating from ``case``."""
    for index, config in enumerate(configs):
        clean = bool((case + index) % 2)
        before = run_op(inp, clean, backend="gluon", config=config)
        assert_matches(inp, before, ref, clean, f"{config} clean_logits={clean}")


def check_bf16_logits(variant, inp: dict, ref: torch.Tensor) -> None:
    """``inp`` again with a bf16 output, the variant's default config, ``clean_logits`` off and on."""
    bf16 = dict(inp, out_logits=torch.empty_like(inp["out_logits"], dtype=torch.bfloat16))
    problem = launch_args(bf16).problem
    assert problem.shape_key.logits_dtype == "bf16" and variant.unsupported(problem) is None
    for clean in (False, True):
        before = run_op(bf16, clean, backend="gluon", config=variant.default_config(problem))
        assert_matches(bf16, before, ref, clean, f"bf16 logits, clean_logits={clean}")


def check_forced_by_name(name: str) -> None:
    """next_n 3 with a sequence shorter than next_n and an empty one, forced by the variant's
    name alone (every other knob defaulted)."""
    inp = fp4_inputs(3, 64, 64, [700, 3, 0, 260], False, seed=5)
    ref = reference_of(inp)
    for clean in (False, True):
        before = run_op(inp, clean, backend="gluon", config={"variant": name})
        assert_matches(inp, before, ref, clean, f"forced, clean_logits={clean}")


def lengths_like(inp: dict, lens: list[int]) -> torch.Tensor:
    """``lens`` in the layout of ``inp``'s lengths (2-D: row ``j`` sees ``L - next_n + 1 + j``)."""
    lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
    if inp["context_lens"].dim() == 1:
        return lens_t
    next_n = inp["context_lens"].shape[1]
    offsets = torch.arange(next_n, dtype=torch.int32, device="cuda") - (next_n - 1)
    return (lens_t[:, None] + offsets[None, :]).clamp_min(0).to(torch.int32)


def check_graph_replay(name: str, lens_2d: bool) -> None:
    """A CUDA graph of the forced variant replayed after the lengths changed in place: shorter
    (each within its blocks), one sequence emptied, one row of another left zero-length."""
    inp = fp4_inputs(2, 64, 32, [900, 5, 70, 333], lens_2d, seed=9)
    config = {"variant": name}
    run_op(inp, True, backend="gluon", config=config)  # warm-up: compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_mqa_logits.paged_mqa_logits(*positional(inp), q_scale=inp["q_scale"], clean_logits=True,
                                          backend="gluon", config=config)
    inp["context_lens"].copy_(lengths_like(inp, [640, 0, 1, 333]))
    inp["out_logits"].fill_(float("nan"))
    before = inp["out_logits"].clone()
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(inp, before, reference_of(inp), True, f"graph replay, lens_2d={lens_2d}")
