"""The host side of the sm_90 ``wgmma_pipes`` variant (backends/gluon/wgmma_pipes.py), without a
GPU: knob errors, the register split between consumer warpgroups and producer warps, the fit
rules, the TMA rule, the candidates and grids, and the launch path, whose kernel arguments
Triton's own binder specialises on meta tensors. The kernels are cross-compiled in
test_compile_wgmma_pipes.py."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("triton.experimental.gluon")

from paged_mqa_logits.backends.gluon import BACKEND  # noqa: E402
from paged_mqa_logits.backends.gluon import wgmma_pipes as hp  # noqa: E402
from paged_mqa_logits.backends.gluon import wgmma as wg  # noqa: E402
from test_wgmma_host import KnobCounter, meta_launch_args, problem, recorded_launches  # noqa: E402

PIPES = hp.VARIANT


def test_knob_errors_say_why():
    p = problem(64, 2)
    default = PIPES.default_config(p)
    assert PIPES.check_config(default, p) is None
    assert "Consumers" in PIPES.check_config(dict(default, Consumers=5), p)
    assert "a divisor of Consumers=3" in PIPES.check_config(dict(default, Consumers=3, RowSplit=2), p)
    assert "CtasPerSM" in PIPES.check_config(dict(default, CtasPerSM=3), p)
    assert "ChunkK" in PIPES.check_config(dict(default, ChunkK=128), p)
    assert "KeyCopy" in PIPES.check_config(dict(default, KeyCopy="bulk"), p)
    assert "wgmma's largest N" in PIPES.check_config(dict(default, RowsPerMMA=8), p)
    # more consumer parts than row groups run (the spare ones free their slots unscored), so the
    # check needs no problem; they are never proposed
    assert PIPES.check_config(dict(default, RowsPerMMA=2, Consumers=4, RowSplit=2)) is None
    assert not PIPES.admits(p, dict(default, RowsPerMMA=2, Consumers=4, RowSplit=2))


def test_register_split_fills_the_register_file():
    """Consumers get equal shares of what the producer warpgroups leave; four consumers in one
    program get 112 registers (their 128-column row group, its weights and the epilogue fit
    without spilling, test_compile_wgmma_pipes.py) beside TMA producers of 24 (Triton gives the
    default-partition consumer the 8 the rounding leaves)."""
    for consumers, split, ctas in ((4, 1, 1), (4, 2, 1), (3, 1, 1), (2, 1, 1), (2, 2, 1), (1, 1, 2)):
        for key_copy in ("tma", "gather"):
            consumer, producer = hp.register_split(ctas, consumers, split, key_copy)
            groups = hp.program_warps(consumers, split) // 4 - consumers
            pool = (consumers + groups) * hp.max_registers(ctas, consumers, split)
            assert consumer % 8 == 0 and producer % 8 == 0
            assert consumers * consumer + groups * producer <= pool
            assert producer == hp.PRODUCER_REGS[key_copy]
            assert ctas * hp.program_warps(consumers, split) * 32 * hp.max_registers(ctas, consumers, split) \
                <= wg.SM_REGISTERS
    assert hp.register_split(1, 4, 1, "tma") == (112, 24)
    assert hp.program_warps(4, 1) == 20 and hp.program_warps(4, 2) == 20 and hp.program_warps(2, 1) == 12


def test_fit_rules():
    n2, n4 = problem(64, 2), problem(64, 4)
    # 64 heads x next_n 2: one 128-column group per consumer fits four consumers per SM
    assert hp.fits(n2, 2, 3, 4, 1, 1, "tma")
    # next_n 4 whole (256 columns): not in 112 registers; in pairs, one 128-column group each
    assert not hp.fits(n4, 4, 3, 4, 1, 1, "tma") and hp.fits(n4, 2, 3, 4, 2, 1, "tma")
    # more consumer parts than row groups
    assert not hp.fits(n2, 2, 3, 4, 2, 1, "tma")
    # ptxas needs the widest wgmma's accumulators under the kernel-wide maxnreg
    assert hp.max_registers(2, 1, 1) == 128 and not hp.fits(n4, 4, 4, 1, 1, 2, "tma")
    # shared memory: four rings of eight 64-token slots and Q do not fit one SM twice
    assert not hp.fits(n2, 2, 8, 4, 1, 2, "tma")
    # calibrated on ptxas: a second row group in flight, rows past an uneven next_n, a
    # split-schedule consumer pair each need registers the 112 of four consumers lack
    assert not hp.fits(problem(32, 3), 2, 3, 4, 1, 1, "tma") and hp.fits(problem(32, 4), 4, 3, 4, 1, 1, "tma")
    assert not hp.fits(problem(64, 3), 2, 3, 4, 2, 1, "tma") and hp.fits(problem(64, 3), 2, 4, 2, 1, 1, "tma")
    assert hp.fits(n4, 2, 3, 4, 2, 1, "tma", "balanced") and not hp.fits(n4, 2, 3, 4, 2, 1, "tma", "split")
    assert hp.fits(n2, 2, 3, 4, 1, 1, "tma", "split")
    # overlapped consumers hold two tiles' accumulators: two of them at 64 heads x next_n 2,
    # four only for narrow tiles; and only parts with one row group (32 heads x next_n 3 in
    # two uneven groups spills under ptxas)
    assert hp.fits(n2, 2, 4, 2, 1, 1, "tma", overlap=1) and not hp.fits(n2, 2, 3, 4, 1, 1, "tma", overlap=1)
    assert hp.fits(problem(32, 2), 2, 3, 4, 1, 1, "tma", overlap=1)
    assert hp.fits(problem(32, 3), 2, 4, 2, 1, 1, "tma") and not hp.fits(problem(32, 3), 2, 4, 2, 1, 1, "tma",
                                                                            overlap=1)


@pytest.mark.parametrize("kv_block_size, preshuffle, kv_align, box", [
    (64, False, 16, 64), (128, False, 16, 64), (256, False, 16, 64), (32, False, 16, 32),
    (16, False, 16, 0),  # a 16-token block's scales would land 64 bytes apart: TMA needs 128
    (1, False, 16, 0), (64, True, 16, 0), (64, False, 4, 0),
])
def test_key_box(kv_block_size, preshuffle, kv_align, box):
    p = problem(64, 2, kv_block_size, preshuffle)
    assert hp.key_box(p, "tma", kv_align) == box
    assert hp.key_box(p, "gather", kv_align) == 0


@pytest.mark.parametrize("heads", (32, 64))
@pytest.mark.parametrize("next_n", range(1, 9))
@pytest.mark.parametrize("batch", (1, 256))
def test_candidates_fit_and_grids(heads, next_n, batch):
    p = problem(heads, next_n, batch=batch)
    cands = PIPES.candidates(p)
    if not cands:  # three row groups of 64 heads: no consumer team holds them (wgmma serves these)
        assert (heads, next_n) == (64, 7) and "no configuration" in PIPES.unsupported(p)
        return
    default = PIPES.default_config(p)
    assert PIPES.admits(p, default) and default["Schedule"] == ("split" if batch < 32 else "balanced")
    schedules = {c["Schedule"] for c in cands}
    assert schedules == ({"balanced", "split"} if batch < 64 else {"balanced"})
    for cfg in cands:
        k = PIPES.knobs(p, cfg)
        assert hp.fits(p, k["RowsPerMMA"], k["num_stages"], k["Consumers"], k["RowSplit"], k["CtasPerSM"],
                       k["KeyCopy"], k["Schedule"])
        grid, splits = PIPES.grid(p, cfg)
        if k["Schedule"] == "balanced":
            assert (grid, splits) == ((132 * k["CtasPerSM"], 1), 1)
        else:
            assert grid == (splits, batch) and splits >= 1


def test_candidates_move_keys_by_tma_where_the_cache_allows():
    assert {c["KeyCopy"] for c in PIPES.candidates(problem(64, 2))} == {"tma"}
    assert {c["KeyCopy"] for c in PIPES.candidates(problem(64, 2, 16, True))} == {"gather"}
    assert {c["KeyCopy"] for c in PIPES.candidates(problem(64, 2, 64, kv_block_stride=64 * 132 + 4))} == {"gather"}


def test_a_tuner_candidate_and_the_fallback_keeps_the_default_variant():
    p = problem(64, 2)
    assert any(c["variant"] == "wgmma_pipes" for c in BACKEND.candidates(p))
    assert BACKEND.default_config(p)["variant"] == "wgmma"
    assert PIPES.cleans_logits


@pytest.mark.parametrize("kv_block_size, block_pad, cache_offset, num_blocks, box", [
    (64, 0, 0, 50, 64), (32, 0, 0, 50, 32), (256, 0, 0, 50, 64),
    (16, 0, 0, 50, 0), (64, 4, 0, 50, 0), (64, 0, 4, 50, 0), (64, 0, 0, 0, 0),
])
def test_descriptors_and_clean_flag_of_each_call(kv_block_size, block_pad, cache_offset, num_blocks, box):
    """``KEY_BOX`` and the two descriptors (keys, scales) as a launch passes them, and the
    ``clean_logits`` flag as a runtime argument (one kernel for both)."""
    p = problem(64, 2, kv_block_size, batch=3, max_model_len=1000, context=1000)
    config = PIPES.default_config(p)
    args = meta_launch_args(p, block_pad=block_pad, num_blocks=num_blocks, cache_offset=cache_offset)
    PIPES.clear_plans()
    (launch,) = recorded_launches(PIPES, args, config)
    (cleaning,) = recorded_launches(PIPES, dataclasses.replace(args, clean_logits=True), config)
    assert launch["KEY_BOX"] == box
    if box:
        assert launch["signature"]["key_desc"].startswith(f"tensordesc<fp8e4nv[1, {box}, 128]")
        assert launch["signature"]["scale_desc"].startswith(f"tensordesc<fp32[1, {box}]")
    else:
        assert launch["key_desc"] is None and launch["scale_desc"] is None
    assert launch["signature"]["clean_logits"] == cleaning["signature"]["clean_logits"] == "i32"
    assert {k: v for k, v in launch.items() if k != "signature"} == \
        {k: v for k, v in cleaning.items() if k != "signature"}
    PIPES.clear_plans()


def test_a_repeated_launch_resolves_no_knobs(monkeypatch):
    p = problem(64, 2, batch=3, max_model_len=1000, context=1000)
    config = PIPES.default_config(p)
    counter = KnobCounter(monkeypatch, hp.WgmmaPipesVariant)
    PIPES.clear_plans()
    recorded_launches(PIPES, meta_launch_args(p), config)
    planned = counter.calls
    boxes = [launch["KEY_BOX"] for args in (meta_launch_args(p), meta_launch_args(p, cache_offset=4))
             for launch in recorded_launches(PIPES, args, config)]
    assert counter.calls == planned and boxes == [64, 0]
    PIPES.clear_plans()
