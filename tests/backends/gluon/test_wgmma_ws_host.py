"""The host side of the sm_90 warp-specialised ``wgmma_ws`` variant
(backends/gluon/wgmma_ws.py), without a GPU: knob errors, the register split, the
candidates' fit and grid, and the launch path, whose kernel arguments Triton's own binder
specialises on meta tensors. The kernels themselves are cross-compiled in
test_compile_wgmma_ws.py."""

from __future__ import annotations

import pytest

pytest.importorskip("triton.experimental.gluon")

from paged_mqa_logits.backends.gluon import wgmma as wg  # noqa: E402
from paged_mqa_logits.backends.gluon import wgmma_ws as ws  # noqa: E402
from paged_mqa_logits.problem import Problem  # noqa: E402
from test_wgmma_host import KnobCounter, meta_launch_args, recorded_launches  # noqa: E402

WS = ws.VARIANT
ARCH = "sm_90"


def problem(heads=64, next_n=1, kv_block_size=64, preshuffle=False, lens_2d=True, batch=64, **overrides) -> Problem:
    fields = dict(arch=ARCH, cu_num=132, batch=batch, next_n=next_n, heads=heads, head_dim=128,
                  kv_block_size=kv_block_size, preshuffle=preshuffle, context=8192, lens_2d=lens_2d, fp8="fn",
                  max_model_len=8192)
    fields.update(overrides)
    return Problem.from_record(fields)


def test_balanced_only_and_knob_errors_say_why():
    p = problem(64, 2)
    assert WS.check_config(WS.default_config(p), p) is None
    assert "expected one of balanced" in WS.check_config(dict(WS.default_config(p), Schedule="split"), p)
    assert "CtasPerSM" in WS.check_config(dict(WS.default_config(p), CtasPerSM=4), p)
    assert "Consumers" in WS.check_config(dict(WS.default_config(p), Consumers=5), p)
    one_group = dict(WS.default_config(p), RowsPerMMA=2)
    assert "a divisor of Consumers=3" in WS.check_config(dict(one_group, Consumers=3, RowSplit=2), p)
    # more consumers per tile than row groups: the spare ones free their slots unscored
    assert WS.check_config(dict(one_group, Consumers=2, RowSplit=2), p) is None
    assert ws.consumer_accumulators(p, 64, 2, 2) == ws.consumer_accumulators(p, 64, 2, 1)
    assert WS.check_config(dict(one_group, RowsPerMMA=1, Consumers=2, RowSplit=2), p) is None
    assert "TMA with 3 consumers faulted" in WS.check_config(dict(one_group, Consumers=3, KeyCopy="tma"), p)


def test_consumers_share_the_register_file_equally():
    """One program of ``Consumers`` consumer warpgroups and a producer fills the register file;
    each consumer gets more registers than as many single-consumer programs would."""
    for consumers in (2, 3, 4):
        for chunk in (64, 128):
            pool = (consumers + 1) * ws.max_registers(1, consumers)
            per = ws.consumer_registers(chunk, 1, consumers)
            assert consumers * per + ws.PRODUCER_REGS[chunk] <= pool
            assert per > ws.consumer_registers(chunk, consumers, 1)
    assert ws.consumer_registers(64, 1, 3) == 152 and ws.consumer_registers(64, 3, 1) == 104
    assert ws.consumer_registers(64, 1, 4) == 104 and ws.consumer_registers(64, 2, 2) == 88


def test_row_split_consumers_hold_half_the_accumulators():
    """With ``RowSplit=2`` each consumer holds only its own row groups: 64 heads x next_n 4 in
    two 128-column groups fits four consumers of 104 registers per SM (whole-tile consumers
    need both groups, 128 accumulator registers); 88 registers are too few for a 128-column
    group (ptxas cannot allocate it), 64-column groups fit them."""
    p4, p2 = problem(64, 4), problem(64, 2)
    assert ws.consumer_accumulators(p4, 64, 2, 1) == 128 and ws.consumer_accumulators(p4, 64, 2, 2) == 64
    assert ws.consumer_accumulators(p4, 64, 1, 2) == 64  # two 64-column groups each, pipelined
    assert ws.fits(p4, 64, 2, 8, 1, 4, 2) and not ws.fits(p4, 64, 2, 8, 1, 4, 1)
    assert not ws.fits(p4, 64, 2, 4, 2, 2, 2)
    assert not ws.fits(p4, 128, 2, 4, 1, 4, 2)  # 96 registers, 128 accumulators per 128-token tile
    assert ws.fits(p2, 64, 1, 4, 2, 2, 2)
    splits = [c for c in WS.candidates(p4) if c["RowSplit"] == 2]
    assert {(c["Consumers"], c["CtasPerSM"]) for c in splits} == {(4, 1)}
    assert not any(c["RowSplit"] == 2 for c in WS.candidates(problem(64, 1)))


@pytest.mark.parametrize("heads", (32, 64))
@pytest.mark.parametrize("next_n", range(1, 9))
def test_candidates_fit_and_grid_is_one_wave(heads, next_n):
    p = problem(heads, next_n)
    if WS.unsupported(p) is not None:  # the wgmma variant serves these (more than two row groups)
        assert next_n >= 5
        assert "no warp-specialised configuration fits" in WS.unsupported(p)
        return
    for cfg in WS.candidates(p) + [WS.default_config(p)]:
        assert set(cfg) == {"variant", *WS.knob_space}
        knobs = WS.knobs(p, cfg)
        chunk, rows, stages, ctas, consumers, split = (knobs[k] for k in ("ChunkK", "RowsPerMMA", "num_stages",
                                                                          "CtasPerSM", "Consumers", "RowSplit"))
        rule = ws.tensor_fits if knobs["HeadSum"] == "tensor" else ws.fits
        assert rule(p, chunk, rows, stages, ctas, consumers, split)
        assert WS.grid(p, cfg) == (132 * ctas, 1)


def test_tensor_head_sum_knob():
    """``HeadSum=tensor`` comes after every fp32 candidate (the default stays fp32), from next_n 2
    on, only with equal row groups and at most two of them per consumer; the error names the knob."""
    for heads, next_n in ((64, 2), (64, 4), (32, 4), (32, 2)):
        p = problem(heads, next_n)
        sums = [c["HeadSum"] for c in WS.candidates(p)]
        assert "tensor" in sums and sums == sorted(sums, key=lambda s: s == "tensor"), (heads, next_n)
        assert WS.default_config(p)["HeadSum"] == "fp32"
        assert WS.constexprs(p, dict(WS.default_config(p), HeadSum="tensor"))["HEAD_SUM"] == 1
    assert not any(c["HeadSum"] == "tensor" for c in WS.candidates(problem(64, 1)))
    for c in WS.candidates(problem(64, 4)):
        if c["HeadSum"] == "tensor":
            assert len(wg.problem_row_groups(problem(64, 4), c["RowsPerMMA"])[::c["RowSplit"]]) <= 2
    with pytest.raises(ValueError, match=r"HeadSum='tensor'.*equal row groups.*next_n 3"):
        WS.knobs(problem(32, 3), dict(WS.default_config(problem(32, 3)), RowsPerMMA=2, HeadSum="tensor"))
    with pytest.raises(ValueError, match=r"HeadSum='bf16'"):
        WS.knobs(problem(32, 2), dict(WS.default_config(problem(32, 2)), HeadSum="bf16"))
    # the head-sum weights take shared memory: per consumer and group, [8, rows * H] bf16
    p = problem(64, 2)
    assert ws.shared_bytes(p, 64, 8, 2, 2, 1, "tensor") - ws.shared_bytes(p, 64, 8, 2) == 2 * 8 * 128 * 2


def test_not_the_default_variant_but_a_tuner_candidate():
    from paged_mqa_logits.backends.gluon import BACKEND

    p = problem(64, 4)
    assert BACKEND.default_config(p)["variant"] == "wgmma"
    assert any(c["variant"] == "wgmma_ws" for c in BACKEND.candidates(p))
    assert not any(c["variant"] == "mma_v2" for c in BACKEND.candidates(p))


# ----------------------------------------------------------------------------- launch
@pytest.mark.parametrize("key_copy, chunk, kv_block_size, preshuffle, block_pad, cache_offset, num_blocks, box", [
    ("tma", 64, 64, False, 0, 0, 50, 64),  # one box per 64-token tile
    ("tma", 128, 64, False, 0, 0, 50, 64),  # two boxes per tile: one per cache block
    ("tma", 64, 16, False, 0, 0, 50, 16),
    ("tma", 64, 256, False, 0, 0, 50, 64),  # a tile inside one cache block
    ("tma", 64, 64, True, 0, 0, 50, 0),  # preshuffled keys are not token-major: gather
    ("tma", 64, 64, False, 4, 0, 50, 0),  # block stride not 16-byte aligned: gather
    ("tma", 64, 64, False, 0, 4, 50, 0),  # cache base not 16-byte aligned: gather
    ("tma", 64, 64, False, 0, 0, 0, 0),  # no cache block to describe: gather
    ("gather", 64, 64, False, 0, 0, 50, 0),
])
def test_key_box_of_each_call(key_copy, chunk, kv_block_size, preshuffle, block_pad, cache_offset, num_blocks, box):
    """``KEY_BOX`` (and the key descriptor, whose boxes it sizes) as a launch passes them."""
    p = problem(64, 2, kv_block_size, preshuffle, batch=3, max_model_len=1000, context=1000)
    config = dict(WS.default_config(p), ChunkK=chunk, KeyCopy=key_copy)
    args = meta_launch_args(p, block_pad=block_pad, num_blocks=num_blocks, cache_offset=cache_offset)
    WS.clear_plans()
    (launch,) = recorded_launches(WS, args, config)
    assert launch["KEY_BOX"] == box
    assert launch["KV_ALIGN"] == (4 if block_pad or cache_offset else 16)
    if box:
        assert launch["signature"]["key_desc"].startswith(f"tensordesc<fp8e4nv[1, {box}, 128]"), launch["signature"]
    else:
        assert launch["key_desc"] is None
    WS.clear_plans()


def test_a_repeated_launch_resolves_no_knobs(monkeypatch):
    """The cached plan holds the config's ``KEY_BOX`` per alignment: later launches of the same
    problem and config resolve no knob, and each still chooses TMA or the gather by its own
    cache's alignment and block count."""
    p = problem(64, 2, batch=3, max_model_len=1000, context=1000)
    config = dict(WS.default_config(p), KeyCopy="tma")
    counter = KnobCounter(monkeypatch, ws.WgmmaWsVariant)
    WS.clear_plans()
    (first,) = recorded_launches(WS, meta_launch_args(p), config)
    assert counter.calls > 0  # the plan was computed
    planned = counter.calls
    boxes = [launch["KEY_BOX"] for args in (meta_launch_args(p), meta_launch_args(p, cache_offset=4),
                                            meta_launch_args(p, num_blocks=0), meta_launch_args(p))
             for launch in recorded_launches(WS, args, config)]
    assert counter.calls == planned
    assert first["KEY_BOX"] == 64 and boxes == [64, 0, 0, 64]
    WS.clear_plans()
