"""The top-k AMD estimate of ``tools/topk_amd_model.py``: its pass prices, the bandwidth and issue
bounds on known numbers, and the committed CSV (labelled an estimate, every shape, ratios that
follow from its times, for ``triton_radix`` and ``triton_sample``)."""

import csv
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import topk_amd_model as m  # noqa: E402

from paged_mqa_logits.arch import ARCH_SPECS  # noqa: E402


def test_pass_prices_follow_the_pipes():
    # 5 VALU per 64 elements: 20 clocks; one LDS add per lane: 8 clocks; a quarter dwordx4: 16 clocks
    p = m.PassCost.of_counts("histogram", valu=5, lds=1, vmem_x4=0.25)
    assert p.bound == "valu" and p.clocks_per_element == pytest.approx(20 / 64)
    loop = m.PassCost.of_loop("x", ["v_add_u32_e32 v1, v2, v3"] * 64 + ["s_cbranch_scc1 .LBB0_1"], elements=128)
    assert loop.bound == "valu" and loop.clocks_per_element == pytest.approx(64 * 4 / 128)


def test_estimate_is_bandwidth_or_issue_bound():
    spec = ARCH_SPECS["gfx942"]
    cheap = m.PassCost("read", 0.0, "valu")
    rows, n = 1024, 131072
    hbm = m.estimate([cheap], "gfx942", rows, n, 0, 304)
    assert hbm.bound == "hbm" and hbm.us == pytest.approx(rows * n * 4 / (spec.hbm_gbps * 1e3))
    few = m.estimate([cheap], "gfx942", 8, n, 0, 8)  # 8 CUs cannot pull the chip's bandwidth
    assert few.bound == "cu-bandwidth" and few.us == pytest.approx(8 * n * 4 / (8 * 64 * spec.clock_mhz) )
    heavy = m.PassCost("hist", 30.0, "valu")
    slow = m.estimate([heavy], "gfx942", rows, n, 0, 304)
    assert slow.bound == "hist:valu" and slow.us == pytest.approx(rows * n * 30 / (4 * 304 * spec.clock_mhz))


def test_committed_csv_is_an_estimate_for_every_shape():
    path = os.path.join(ROOT, "benchmarks", "amd", "topk_estimate.csv")
    with open(path) as f:
        text = f.read()
    assert text.startswith("# ESTIMATE, NOT A MEASUREMENT: model " + m.MODEL)
    rows = list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))
    assert {(r["arch"], int(r["rows"]), int(r["context"])) for r in rows} == \
        {(a, r, c) for a in m.ARCHS for r in m.ROWS for c in m.CONTEXTS}
    for r in rows:
        assert float(r["speedup_vs_aiter"]) == pytest.approx(float(r["aiter_us"]) / float(r["ours_us"]), rel=0.02)
        assert float(r["sample_speedup_vs_aiter"]) == pytest.approx(float(r["aiter_us"]) / float(r["sample_us"]),
                                                                    rel=0.02)
