"""The host side of the sm_90 warp-specialised ``wgmma_ws`` variant
(backends/gluon/hopper_wgmma_ws_host.py), without a GPU: knob errors, the register split, the
candidates' fit and grid, and the launch path, whose kernel arguments Triton's own binder
specialises on meta tensors. The kernels themselves are cross-compiled in
test_compile_hopper_wgmma_ws.py."""

from __future__ import annotations

import pytest

pytest.importorskip("triton.experimental.gluon")

from paged_mqa_logits.backends.gluon import hopper_wgmma_ws_host as ws  # noqa: E402
from paged_mqa_logits.problem import Problem  # noqa: E402

WS = ws.VARIANT
ARCH = "sm_90"


def problem(heads=64, next_n=1, kv_block_size=64, preshuffle=False, lens_2d=True, batch=64, **overrides) -> Problem:
    fields = dict(arch=ARCH, cu_num=132, batch=batch, next_n=next_n, heads=heads, head_dim=128,
                  kv_block_size=kv_block_size, preshuffle=preshuffle, context=8192, lens_2d=lens_2d, fp8="fn",
                  device_type="cuda", max_model_len=8192)
    fields.update(overrides)
    return Problem(**fields)


def test_balanced_only_and_knob_errors_say_why():
    p = problem(64, 2)
    assert WS.check_config(WS.default_config(p), p) is None
    assert "expected one of balanced" in WS.check_config(dict(WS.default_config(p), Schedule="split"), p)
    assert "CtasPerSM" in WS.check_config(dict(WS.default_config(p), CtasPerSM=4), p)
    assert "Consumers" in WS.check_config(dict(WS.default_config(p), Consumers=4), p)


def test_consumers_share_the_register_file_equally():
    """One program of ``Consumers`` consumer warpgroups and a producer fills the register file;
    each consumer gets more registers than as many single-consumer programs would."""
    for consumers in (2, 3):
        for chunk in (64, 128):
            pool = (consumers + 1) * ws.max_registers(1, consumers)
            per = ws.consumer_registers(chunk, 1, consumers)
            assert consumers * per + ws.PRODUCER_REGS[chunk] <= pool
            assert per > ws.consumer_registers(chunk, consumers, 1)
    assert ws.consumer_registers(64, 1, 3) == 152 and ws.consumer_registers(64, 3, 1) == 104


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
        chunk, rows, stages, ctas, consumers = (knobs[k] for k in ("ChunkK", "RowsPerMMA", "num_stages", "CtasPerSM",
                                                                   "Consumers"))
        assert ws.fits(p, chunk, rows, stages, ctas, consumers)
        assert WS.grid(p, cfg) == (132 * ctas, 1)


def test_not_the_default_variant_but_a_tuner_candidate():
    from paged_mqa_logits.backends.gluon import BACKEND

    p = problem(64, 4)
    assert BACKEND.default_config(p)["variant"] == "wgmma"
    assert any(c["variant"] == "wgmma_ws" for c in BACKEND.candidates(p))
    assert not any(c["variant"] == "mma_v2" for c in BACKEND.candidates(p))
