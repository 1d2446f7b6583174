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
