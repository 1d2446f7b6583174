"""``tools/amd_side_by_side.py``: its CI sample of our kernels (CI has no AITER checkout) and the
committed report, which the gfx942 / gfx950 tables' estimates must match."""

import csv
import math
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import amd_side_by_side as sbs  # noqa: E402
import cdna_cycles  # noqa: E402
from paged_mqa_logits import table  # noqa: E402
from paged_mqa_logits.backends.gluon import mfma  # noqa: E402
from paged_mqa_logits.aot.compile import max_waves_per_simd  # noqa: E402
from paged_mqa_logits.backends.flydsl.toolchain import NOT_INSTALLED, flydsl_installed  # noqa: E402

REPORT = os.path.join(ROOT, "benchmarks", "amd", "side_by_side.csv")
MFMA_OF = {("gfx942", "fp8"): "v_mfma_f32_(16x16x32|32x32x16)_fp8_fp8",
           ("gfx950", "fp8"): "v_mfma_f32_(16x16x32|32x32x16)_fp8_fp8",
           ("gfx950", "f8f6f4"): "v_mfma_scale_f32_(16x16x128|32x32x64)_f8f6f4"}


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    if not flydsl_installed():  # the sample compiles FlyDSL kernels beside the Gluon ones
        pytest.skip(NOT_INSTALLED)
    out = str(tmp_path_factory.mktemp("amd_side_by_side"))
    rows = []
    for arch, heads, next_n, block, pre, batch in sbs.SAMPLE:
        rows += sbs.our_rows([sbs.Shape(arch, heads, next_n, block, pre)], out, 1, (batch,))
    return rows


def test_the_sample_covers_both_backends_and_both_chips(sample):
    assert {r["backend"] for r in sample} == {"gluon", "flydsl"}
    assert {r["arch"] for r in sample} == {"gfx942", "gfx950"}


def test_sample_report_columns(sample):
    """Every column is there and holds what it claims: resources of a spill-free kernel at the
    occupancy it asks for, per 64 keys exactly the MFMA work of 64 keys x every row x all heads,
    and an estimate that is its iteration cycles scaled to 64 keys."""
    for r in sample:
        assert tuple(r) == sbs.COLUMNS and r["ok"] == 1 and not r["error"], r
        knobs = dict(kv.split("=") for kv in r["knobs"].split())
        assert r["scratch"] == 0 and r["vgprs"] > 0 and r["sgprs"] > 0, r["kernel"]
        assert 1 <= r["waves"] <= min(int(knobs["WavePerEU"]), max_waves_per_simd(r["vgprs"])), r["kernel"]
        assert re.fullmatch(MFMA_OF[(r["arch"], knobs["Mfma"])], r["mfma_kind"]), r["kernel"]
        macs = cdna_cycles.mfma_macs(r["mfma_kind"])
        assert r["mfma"] * macs == pytest.approx(64 * r["heads"] * 128 * r["next_n"]), r["kernel"]
        assert r["vmem_bytes"] >= 64 * 128 and r["vmem"] > 0 and r["valu"] > 0 and r["salu"] > 0, r["kernel"]
        assert r["waitcnt"] > 0 and r["single_wave"] > 0, r["kernel"]
        assert r["bound"] in cdna_cycles.PIPES + ("latency",), r["kernel"]
        assert r["cycles_per_64_keys"] >= r["iteration"] * 64 * r["heads"] * 128 * r["next_n"] / (
            r["mfma"] * macs) - 1, r["kernel"]


# ----------------------------------------------------------------------------- the committed report
@pytest.fixture(scope="module")
def report():
    with open(REPORT) as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == sbs.COLUMNS
        return list(reader)


def test_the_report_covers_the_grid_for_ours_and_aiter(report):
    shapes = {tuple(r[k] for k in sbs.SHAPE_COLUMNS) for r in report}
    assert len(shapes) == len(sbs.grid())
    for who in ("ours", "aiter"):
        assert {tuple(r[k] for k in sbs.SHAPE_COLUMNS) for r in report if r["who"] == who} == shapes, who


def test_the_report_holds_the_picks_of_today(report, monkeypatch):
    """Our rows name the kernels the dispatch picks now (the report is refreshed with the picks).
    The report is compiled with Triton 3.6, whose register allocation needs no VGPR margin; later
    Tritons' margin resolves some rows to another Q placement or prefetch."""
    monkeypatch.setattr(mfma, "AMD_VGPR_MARGIN", 0)
    for shape in sbs.grid():
        picks = sbs.our_picks(shape)
        mine = [r for r in report if r["who"] == "ours" and tuple(r[k] for k in sbs.SHAPE_COLUMNS) == (
            shape.arch, str(shape.heads), str(shape.next_n), str(shape.kv_block_size), str(int(shape.preshuffle)))]
        assert sorted(r["knobs"] for r in mine) == sorted(
            " ".join(f"{k}={v}" for k, v in sorted(knobs.items())) for _, knobs, _ in picks.values()), shape


def test_every_amd_table_row_carries_its_estimate_from_the_report(report):
    estimates = sbs.table_estimates(report)
    for arch in sbs.ARCHS:
        rows = table.parse_file(os.path.join(ROOT, "configs", f"{arch}_tuned.csv"))
        for row in rows:
            shape_key = row.shape_key
            key = (row.arch, shape_key.heads, shape_key.kv_block_size, int(shape_key.preshuffle), shape_key.next_n,
                   shape_key.batch)
            assert row.estimate == estimates[key], row.source
            assert row.estimate.model == cdna_cycles.MODEL and row.us is None, row.source


def test_our_kernels_in_the_report_meet_the_targets(report):
    """Zero scratch and the occupancy asked for on each of our kernels; per shape our worst pick
    at most AITER's default and best; the geomean against AITER's default at least 10% better."""
    for r in report:
        if r["who"] == "ours":
            assert r["ok"] == "1" and r["scratch"] == "0", r["kernel"]
            knobs = dict(kv.split("=") for kv in r["knobs"].split())
            assert int(r["waves"]) == int(knobs["WavePerEU"]), r["kernel"]
    comparison = sbs.comparison(report)
    for c in comparison:
        assert c["ours"] <= c["aiter_best"] and c["ours"] <= c["aiter_default"], c
    for arch in sbs.ARCHS:
        ratios = [c["ours"] / c["aiter_default"] for c in comparison if c["arch"] == arch]
        assert math.exp(sum(map(math.log, ratios)) / len(ratios)) <= 0.9, arch


def test_the_report_holds_a_head_sum_tensor_twin_of_every_gluon_pick_where_it_exists(report):
    """``ours-tensor`` rows: the HeadSum=tensor twin of every Gluon pick on the archs offering it,
    compiled without scratch at the pick's occupancy, each paired with its pick by the summary."""
    twins = [r for r in report if r["who"] == sbs.TENSOR_WHO]
    picks = [r for r in report if r["who"] == "ours" and r["backend"] == "gluon"
             and r["arch"] in mfma.TENSOR_HEAD_SUM_ARCHS]
    assert twins and {r["arch"] for r in twins} == set(mfma.TENSOR_HEAD_SUM_ARCHS)
    assert len(twins) == len(picks)
    for r in twins:
        assert r["ok"] == "1" and r["scratch"] == "0" and "HeadSum=tensor" in r["knobs"].split(), r["kernel"]
        assert "bf16" in r["mfma_kind"], r["kernel"]
    pairs = sbs.tensor_pairs(report)
    assert sum(len(p) for p in pairs.values()) == len(twins)
    assert any(line.startswith(f"{arch}: {len(pairs[arch])} Gluon picks; HeadSum=tensor")
               for line in sbs.summary(report) for arch in pairs)
    # the comparison with AITER stays on the picks: the same with and without the twins
    assert sbs.comparison(report) == sbs.comparison([r for r in report if r["who"] != sbs.TENSOR_WHO])


def test_head_sum_tensor_rows_are_the_gluon_picks_with_the_knob(tmp_path):
    arch, heads, next_n, block, pre, batch = sbs.SAMPLE[0]
    shape = sbs.Shape(arch, heads, next_n, block, pre)
    twins = sbs.our_rows([shape], str(tmp_path), 1, (batch,), head_sum_tensor=True)
    picks = [(backend, knobs) for backend, knobs, _ in sbs.our_picks(shape, (batch,)).values()]
    assert [r["knobs"] for r in twins] == [" ".join(f"{k}={v}" for k, v in sorted(dict(knobs, HeadSum="tensor").items()))
                                           for backend, knobs in picks if backend == "gluon"]
    assert all(r["who"] == sbs.TENSOR_WHO and r["ok"] == 1 for r in twins)
