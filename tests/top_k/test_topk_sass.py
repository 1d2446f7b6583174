"""``tools/topk_sass.py`` (cross-compiled sm_90 SASS, no GPU): it compiles every kernel it counts and prints
their loops, so a change to a kernel's signature cannot leave the tool behind (full tier: about a minute)."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("triton")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "tools"))


@pytest.mark.full
def test_sass_counts_print(capsys):
    import topk_sass

    assert topk_sass.main(["--width", "8192", "--register-list", "4096"]) == 0
    out = capsys.readouterr().out
    assert "triton_radix (BLOCK" in out and "triton_sample (BLOCK 8192, 8 warps" in out
    assert "local memory 0 bytes" in out
    assert "triton_sample's seed alone:" in out and "register finish alone (4096 entries)" in out
    assert "held row alone (8192 positions)" in out


@pytest.mark.full
def test_in_place_stores_skip_shared_memory():
    """A held row's selection stored in place by ``triton_select.emit`` (NVIDIA's default,
    ``triton_sample.in_place_for``) goes out as one predicated global store an element a thread holds, with none
    of the shared-memory round trip ``tl.store``'s own layout costs (the pointers and the mask: 83 shared stores
    against 19 at 8 warps)."""
    import topk_sass
    from paged_mqa_logits.top_k import triton_sample

    assert triton_sample.in_place_for("sm_90") and triton_sample.in_place_for("cuda")
    assert not any(triton_sample.in_place_for(arch) for arch in ("cpu", "gfx942", "gfx950", "xpu"))
    counts = {}
    for in_place in (True, False):
        code, _ = topk_sass.compile_sm90(topk_sass._held_only, {"ROW": 8192, "COLUMNS": 1024, "IN_PLACE": in_place}, 8)
        counts[in_place] = [sum(i.opcode.startswith(op) for i in code) for op in ("STS", "STG")]
    assert counts[True][1] == counts[False][1] == 8192 // 256
    assert counts[False][0] - counts[True][0] >= 48, counts
