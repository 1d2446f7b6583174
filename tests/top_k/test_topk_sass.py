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


@pytest.mark.full
def test_compaction_list_stored_in_place():
    """The compaction's 8-byte list entries stored in place (``triton_select.store`` with ``LIST_IN_PLACE``): the loop
    that reads the row and lists its survivors stores one ``STG.E.64`` an element a thread holds either way, and
    in place without the shared-memory round trip of ``tl.store``'s layout (79 shared stores against 7 at
    ``BLOCK`` 8192 over 8 warps, 959 instructions against 741)."""
    import topk_sass
    from paged_mqa_logits.aot import sass
    from paged_mqa_logits.top_k import triton_sample

    counts = {}
    for in_place in (True, False):
        constexprs = {"NEXT_N": 1, "LENS_2D": False, "HAS_TABLE": False, "BLOCK": 8192, "STRIPES": 8,
                      "LIST_BLOCK": 1024, "REGISTER_LIST": 8192, "ROW": 8192, "PREFETCH": True,
                      "IN_PLACE": in_place, "LIST_IN_PLACE": in_place, "LISTS": True}
        code, _ = topk_sass.compile_sm90(triton_sample._topk_sample_kernel, constexprs, 8)
        compaction = next(loop for loop in sass.loops(code) if any(i.opcode.startswith("LDG") for i in loop)
                          and any(i.opcode.startswith("STG") for i in loop))
        counts[in_place] = (sum(i.opcode == "STG.E.64" for i in compaction),
                            sum(i.opcode.startswith("STS") for i in compaction), len(compaction))
    assert counts[True][0] == counts[False][0] == 8192 // 256, counts
    assert counts[False][1] - counts[True][1] >= 48 and counts[True][2] < counts[False][2], counts


def test_list_in_place_only_on_sparse_lists():
    """The compaction lists in place on NVIDIA rows of at least 16 k (32k at k 2048, 8k at k 512), never where a
    third of the row is listed (8k at k 2048), nor where nothing is stored in place."""
    from paged_mqa_logits.top_k import triton_sample

    assert triton_sample.list_in_place_for("cuda", 2048, 32768) and triton_sample.list_in_place_for("sm_90", 512, 8192)
    assert not triton_sample.list_in_place_for("cuda", 2048, 8192)
    assert not triton_sample.list_in_place_for("cuda", 2048, 32767)
    assert not any(triton_sample.list_in_place_for(arch, 2048, 131072) for arch in ("cpu", "gfx942", "gfx950"))
