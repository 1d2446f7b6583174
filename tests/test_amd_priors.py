"""The AMD priors (``configs/gfx942_tuned.csv``, ``configs/gfx950_tuned.csv``): every row says
where its pick comes from, and what its provenance claims about our kernels holds.

* ``prior:upstream ...`` rows keep upstream's pick; for gluon that is only allowed where our
  mfma kernel keeps Q in VGPRs with key prefetch at that occupancy;
* ``prior:static-proxy ...`` rows were chosen from our kernels' static proxies: gluon rows that
  moved off upstream's WavePerEU 4 (which would stage Q in LDS without prefetch at H 64), and
  every gfx942 flydsl row (upstream has no FlyDSL paged kernel for gfx942);
* ``prior:estimate ...`` rows were moved by the cycle estimate (their earlier pick was estimated
  slower than AITER's best Gluon kernel): gluon ChunkK 128 / WavePerEU 4;
* flydsl rows name the defaults our backend resolves for the row's shape.
"""

import os

import pytest

from paged_mqa_logits import table
from paged_mqa_logits.backends.flydsl.backend import BACKEND as FLYDSL
from paged_mqa_logits.backends.gluon import mfma
from paged_mqa_logits.problem import Problem

MFMA = mfma.VARIANT

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
UPSTREAM_WAVES = 4  # upstream's gluon pick for batch * next_n < 128


def _rows(arch):
    rows = table.parse_file(os.path.join(CONFIGS, f"{arch}_tuned.csv"))
    assert rows and all(row.arch == arch for row in rows)
    return rows


def _problem(row):
    return Problem(row.arch, row.cu_num, row.shape_key, row.context, True, MFMA.fp8[row.arch], 8192)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_every_row_says_where_its_pick_comes_from(arch):
    # (that no table cites a document outside the repository is tests/test_docs_stand_alone.py's check)
    for row in _rows(arch):
        assert row.provenance.startswith(("prior:upstream ", "prior:static-proxy ", "prior:estimate ")), row.source
        assert row.us is None, f"{row.source}: a prior has no measurement"


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_gluon_priors_keep_q_in_vgprs_with_prefetch(arch, monkeypatch):
    # The provenance quotes the VGPR estimate against the budget of Triton 3.6's allocator;
    # later compilers need a margin more (mfma.AMD_VGPR_MARGIN), and their selection then
    # stages Q in LDS or drops the prefetch for some of these rows instead of spilling.
    monkeypatch.setattr(mfma, "AMD_VGPR_MARGIN", 0)
    moved = 0
    for row in _rows(arch):
        if row.backend != "gluon":
            continue
        problem = _problem(row)
        knobs = MFMA.knobs(problem, row.knobs)
        chunk, waves, q_lds, prefetch = (knobs[k] for k in ("ChunkK", "WavePerEU", "QInLDS", "Prefetch"))
        assert MFMA.admits(problem, row.knobs), row.source
        assert q_lds == 0 and prefetch in (1, 2), f"{row.source}: {row.knobs} stages Q in LDS or drops the prefetch"
        assert f"ChunkK {chunk}/WavePerEU {waves}" in row.provenance, row.source
        if waves != UPSTREAM_WAVES:
            moved += 1
            assert row.provenance.startswith("prior:static-proxy "), row.source
            # and upstream's occupancy really would have changed the kernel
            upstream = MFMA.knobs(problem, {**row.knobs, "WavePerEU": UPSTREAM_WAVES})
            assert upstream["QInLDS"] == 1 or upstream["Prefetch"] == 0, row.source
    assert moved > 0  # H 64 at ChunkK 256: upstream's WavePerEU 4 does not carry over


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_flydsl_priors_name_the_defaults_they_run(arch):
    rows = [row for row in _rows(arch) if row.backend == "flydsl"]
    assert rows
    for row in rows:
        problem = _problem(row)
        config = {**FLYDSL.default_config(problem), **row.knobs}
        assert config in FLYDSL.candidates(problem), row.source
        for knob in ("Schedule", "Mfma"):
            assert f"{knob}={config[knob]}" in row.provenance, row.source
        assert f"ChunkK {config['ChunkK']}, WavePerEU {config['WavePerEU']}" in row.provenance, row.source
        expected = "prior:static-proxy " if arch == "gfx942" else "prior:upstream "
        assert row.provenance.startswith(expected), row.source
