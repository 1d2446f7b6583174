"""The cycle model of ``tools/cdna_cycles.py`` on hand-written loops whose cost is known."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import cdna_cycles as cc  # noqa: E402


def profile(*lines: str) -> cc.LoopProfile:
    """The profile of a loop of ``lines`` closed by its backward branch."""
    return cc.profile([*lines, "s_cbranch_scc1 .LBB0_1"])


MFMA_942 = "v_mfma_f32_16x16x32_fp8_fp8 v[0:3], v[4:5], v[6:7], v[0:3]"
SCALED_950 = "v_mfma_scale_f32_16x16x128_f8f6f4 v[0:3], v[4:11], v[12:19], v[0:3], v20, v21"


def test_pipes_charge_each_instruction_class_its_documented_clocks():
    p = profile(MFMA_942, SCALED_950, "v_add_f32_e32 v1, v2, v3", "v_mad_u64_u32 v[0:1], s[0:1], v2, v3, v[4:5]",
                "s_add_i32 s0, s0, 1", "buffer_load_dwordx4 v[8:11], v1, s[0:3], 0 offen",
                "buffer_load_dword v12, v1, s[0:3], 0 offen", "ds_read_b128 v[8:11], v1", "ds_bpermute_b32 v0, v1, v2")
    # 4 passes + 8 passes; VALU: 1 + 2 passes + one issue slot per MFMA; SALU: the add and the branch
    assert p.pipes == {"mfma": 4 * 4 + 8 * 4, "valu": 4 + 8 + 2 * 4, "salu": 2 * 4,
                       "vmem": 4 * (16 + 4), "lds": 4 * (8 + 2)}
    assert p.macs == 16 * 16 * 32 + 16 * 16 * 128 and p.vmem_bytes == 64 * (16 + 4)
    assert p.mfma_kinds == {"v_mfma_f32_16x16x32_fp8_fp8": 1, "v_mfma_scale_f32_16x16x128_f8f6f4": 1}


def test_an_unknown_mfma_is_an_error_not_a_guess():
    with pytest.raises(ValueError, match="no pass count for MFMA 'v_mfma_f32_32x32x8_f16'"):
        profile("v_mfma_f32_32x32x8_f16 v[0:15], v[0:1], v[2:3], v[0:15]")


def test_a_load_waited_for_in_its_own_iteration_exposes_the_memory_latency():
    waited = profile("buffer_load_dword v1, v0, s[0:3], 0 offen", "s_waitcnt vmcnt(0)", "v_add_f32_e32 v2, v1, v2")
    assert waited.single_wave == cc.VMEM_LATENCY + 3 * cc.ISSUE  # the latency, then the wait, add and branch
    # the same load waited for one iteration later (vmcnt(1): the newest may stay in flight): two
    # loads overlap, so an iteration costs half the latency (the loop is far shorter than it)
    prefetched = profile("buffer_load_dword v1, v0, s[0:3], 0 offen", "s_waitcnt vmcnt(1)", "v_add_f32_e32 v2, v1, v2")
    assert prefetched.single_wave == (cc.VMEM_LATENCY + 3 * cc.ISSUE) / 2


def test_dependent_mfmas_wait_for_the_matrix_pipe_and_their_readers_for_the_result():
    chain = profile(MFMA_942, MFMA_942, "v_max_f32_e32 v8, 0, v0")
    # two MFMAs back to back on the pipe (16 clocks each), the max reads the result 8 clocks later
    assert chain.single_wave == 16 + 16 + 8 + cc.ISSUE + cc.ISSUE
    assert chain.pipes["mfma"] == 32


def test_the_estimate_is_the_busiest_pipe_or_the_latency_shared_by_the_waves():
    p = profile("buffer_load_dword v1, v0, s[0:3], 0 offen", "s_waitcnt vmcnt(0)", MFMA_942)
    alone = cc.estimate(p, 1, heads=16, rows_per_sequence=1)
    assert alone.bound == "latency" and alone.cycles_per_iteration == p.single_wave
    crowded = cc.estimate(p, 8, heads=16, rows_per_sequence=1)
    assert crowded.cycles_per_iteration == max(p.pipes["vmem"], p.single_wave / 8)
    # normalised to 64 keys x every row of the sequence: 16 heads x 128 dims x 64 keys x 2 rows
    two_rows = cc.estimate(p, 1, heads=16, rows_per_sequence=2)
    assert two_rows.scale == 64 * 16 * 128 * 2 / (16 * 16 * 32)
    assert two_rows.cycles_per_64_keys == pytest.approx(two_rows.cycles_per_iteration * two_rows.scale)
    with pytest.raises(ValueError, match="no MFMA"):
        cc.estimate(cc.LoopProfile(), 1, 16, 1)


def test_a_bf16_head_sum_mfma_costs_pipe_time_but_scores_nothing():
    """The HeadSum=tensor MFMA (gfx950 ``32x32x16`` bf16: 8 passes) occupies the matrix pipe and
    an issue slot; the normalisation counts the fp8 score MFMA's multiply-adds only."""
    bf16 = "v_mfma_f32_32x32x16_bf16 v[0:15], v[16:19], v[20:23], 0"
    p = profile(SCALED_950, bf16)
    assert p.pipes["mfma"] == 8 * 4 + 8 * 4 and p.pipes["valu"] == 2 * 4
    assert p.macs == 16 * 16 * 128
    assert cc.mfma_passes("v_mfma_f32_32x32x8_bf16") == 8 and cc.mfma_passes("v_mfma_f32_16x16x16_bf16") == 4
