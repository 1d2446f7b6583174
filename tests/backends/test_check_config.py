"""Every knob set a backend proposes (its candidates and defaults) passes its own
``check_config``, so the declared KNOB_SPACEs are never narrower than what the tuner writes."""

import dataclasses

import pytest

from paged_mqa_logits import backends
from paged_mqa_logits.problem import Problem, ShapeKey

ARCH_FP8 = {"cpu": "fn", "sm_90": "fn", "gfx942": "fnuz", "gfx950": "fn"}


def problems():
    for arch, fp8 in ARCH_FP8.items():
        for heads in (32, 64):
            for next_n in (1, 2, 4):
                for kv_block_size, pre in ((1, False), (16, True), (64, False), (256, True)):
                    key = ShapeKey(heads=heads, head_dim=128, kv_block_size=kv_block_size, preshuffle=pre, batch=8,
                                   next_n=next_n)
                    yield Problem(arch=arch, cu_num=0 if arch == "cpu" else 132, shape_key=key, context=8192,
                                  lens_2d=True, fp8=fp8, max_model_len=131072)


@pytest.mark.parametrize("name", ["torch", "triton", "gluon", "flydsl"])
def test_candidates_and_defaults_pass_check_config(name):
    backend = backends.get(name)
    checked = 0
    for problem in problems():
        if backend.unsupported(problem) is not None:
            continue
        for config in backend.candidates(problem) + [backend.default_config(problem)]:
            assert backend.check_config(config, problem) is None, (problem.describe(), config)
            assert backend.check_config(config) is None, config
            checked += 1
    assert checked


def test_variant_configs_are_judged_for_their_problem():
    gluon = backends.get("gluon")
    p = next(p for p in problems() if p.arch == "gfx942")
    assert "f8f6f4" in str(gluon.check_config({"variant": "mfma", "Mfma": "f8f6f4"}, p))  # gfx950 only
    assert gluon.check_config({"variant": "mfma", "Mfma": "f8f6f4"}, dataclasses.replace(p, arch="gfx950",
                                                                                         fp8="fn")) is None
