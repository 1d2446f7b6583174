"""The host side of the sm_90 ``wgmma_fp4_pipes`` variant (backends/gluon/hopper_fp4_pipes.py),
without a GPU: what it serves and declines, that it never becomes the default, its knobs, its
register split and fit rules, its candidates, and the launch it makes (recorded by Triton's
binder, nothing compiled). The kernel is cross-compiled in test_compile_hopper_fp4_pipes.py."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("triton.experimental.gluon")

from paged_mqa_logits import dispatch  # noqa: E402
from paged_mqa_logits.backends.gluon import BACKEND, hopper_fp4_pipes as fpp, hopper_pipes as hp  # noqa: E402
from paged_mqa_logits.backends.gluon import variants  # noqa: E402
from paged_mqa_logits.problem import Target  # noqa: E402
from test_hopper_fp4_host import meta_fp4_launch_args, problem  # noqa: E402
from test_hopper_wgmma_host import problem as fp8_problem, recorded_launches  # noqa: E402

V = fpp.VARIANT
SHAPES = [(32, 1), (64, 1), (32, 2), (64, 2), (32, 3), (64, 3), (32, 4), (64, 4)]


def test_it_is_registered_serves_fp4_and_declines_the_rest():
    assert V in variants() and V.cleans_logits
    assert V.unsupported(problem()) is None and V.unsupported(problem(logits_dtype="bf16")) is None
    assert "fp4" in V.unsupported(fp8_problem())
    assert "preshuffled" in V.unsupported(problem(preshuffle=True))
    assert "arch" in V.unsupported(dataclasses.replace(problem(), arch="gfx950", fp8="fn"))
    assert "heads" in V.unsupported(problem(heads=512))


def test_it_is_never_the_default():
    """``wgmma_fp4`` stays the default: the backend's default, the variant a config naming none
    runs, and the dispatcher's pick without a table row."""
    for heads, next_n in SHAPES:
        p = problem(heads=heads, next_n=next_n)
        assert BACKEND.default_config(p)["variant"] == "wgmma_fp4"
        assert BACKEND.variant(p, {}).name == "wgmma_fp4"
    choice = dispatch.choose(problem(batch=3, next_n=3, heads=32), Target.present("sm_90", 132))
    assert choice.config.get("variant", "wgmma_fp4") == "wgmma_fp4", choice
    (spec,) = BACKEND.compile_specs("sm_90", [{"heads": 64, "next_n": 2, "kv_block_size": 64, "kv_format": "fp4",
                                                "ChunkK": 64, "RowsPerMMA": 2}])
    assert spec.knobs["variant"] == "wgmma_fp4"


def test_knobs_are_pipes_less_key_copy():
    p = problem(heads=64, next_n=2)
    default = V.default_config(p)
    k = V.knobs(p, default)
    assert "KeyCopy" not in k and k["ChunkK"] == 64 and k["num_warps"] == 4
    assert V.check_config(dict(default, Consumers=4), p) is not None  # two consumers at most
    assert V.check_config(dict(default, Consumers=1, RowSplit=2), p) is not None
    assert V.check_config(dict(default, ChunkK=128), p) is not None
    assert V.check_config(dict(default, num_stages=9), p) is not None
    assert "KeyCopy" in V.check_config(dict(default, KeyCopy="tma"), p)  # the keys always come through registers
    assert V.check_config(default, p) is None


@pytest.mark.parametrize("ctas,consumers,split", [(1, 2, 1), (1, 2, 2), (2, 1, 1)])
def test_register_split_fills_the_sm_and_gives_the_producers_theirs(ctas, consumers, split):
    consumer, producer = fpp.register_split(ctas, consumers, split)
    teams = consumers // split
    assert producer == fpp.PRODUCER_REGS and consumer % 8 == 0 and consumer <= 256
    used = ctas * 128 * (consumers * consumer + teams * producer)
    assert used <= 65536 and 65536 - used < ctas * 128 * consumers * 8  # nothing left a consumer could take
    assert fpp.program_warps(consumers, split) == 4 * (consumers + teams)


@pytest.mark.parametrize("heads,next_n", SHAPES)
def test_candidates_are_few_and_fit(heads, next_n):
    p = problem(heads=heads, next_n=next_n)
    candidates = V.candidates(p)
    assert 1 <= len(candidates) <= 8
    for c in candidates:
        assert c["variant"] == V.name and V.admits(p, c) and V.check_config(c, p) is None
        k = V.knobs(p, c)
        need = hp.consumer_need(p, k["RowsPerMMA"], k["RowSplit"], k["Schedule"], k["Overlap"])
        assert need <= fpp.register_split(k["CtasPerSM"], k["Consumers"], k["RowSplit"])[0]
        assert k["CtasPerSM"] * (fpp.shared_bytes(p, k["num_stages"], k["Consumers"], k["RowSplit"]) + 1024) \
            <= 228 * 1024
    assert V.default_config(p) in [dict(c, Schedule=V.default_config(p)["Schedule"]) for c in candidates]


def test_a_config_that_does_not_fit_is_refused():
    p = problem(heads=64, next_n=4)
    # next_n 4 x 64 heads whole in one consumer of two teams: 256 accumulator columns
    assert not V.admits(p, dict(V.default_config(p), Consumers=2, RowSplit=1, RowsPerMMA=4))


@pytest.mark.parametrize("schedule", ["split", "balanced"])
@pytest.mark.parametrize("clean", [False, True])
def test_launch_passes_the_exponents_the_flag_and_the_split(schedule, clean):
    p = problem(heads=32, next_n=2, kv_block_size=32)
    config = dict(V.default_config(p), Schedule=schedule)
    args = dataclasses.replace(meta_fp4_launch_args(p, block_pad=4), clean_logits=clean)
    (launch,) = recorded_launches(V, args, config)
    k = V.knobs(p, config)
    consumer, producer = fpp.register_split(k["CtasPerSM"], k["Consumers"], k["RowSplit"])
    assert launch["CONSUMER_REGS"] == consumer and launch["PRODUCER_REGS"] == producer
    assert launch["STAGES"] == config["num_stages"] and launch["KV_BLOCK_SIZE"] == 32
    assert launch["BALANCED"] == (schedule == "balanced")
    assert launch["signature"]["q_scale_ptr"] == "*i32" and launch["signature"]["q_ptr"] == "*u8"
    assert "clean_logits" in launch["signature"]  # a runtime flag: one kernel serves both


def test_compile_matrix_is_distinct_kernels_of_admitted_configs():
    matrix = V.compile_matrix("sm_90")
    keys = set()
    for cfg in matrix:
        p = V.spec_problem("sm_90", cfg)
        assert V.admits(p, cfg), cfg
        keys.add((cfg.get("logits_dtype", "fp32"), V.kernel_key(p, cfg)))
    assert len(keys) == len(matrix)
