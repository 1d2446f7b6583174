"""``triton_sample.launch(stop_after=...)`` and ``tools/topk_phases.py`` on CPU tensors (the interpreter): the
compaction alone lists exactly the positions at or above a threshold, the seed alone lists none, neither writes
the output, and the tool prints one row a shape and knob set with the lists' lengths."""

import os
import sys

import pytest
import torch

from paged_mqa_logits.top_k import triton_sample
from paged_mqa_logits.top_k.validate import check_call

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import topk_phases  # noqa: E402


def _call(rows=3, width=700, k=32, seed=5):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, width, generator=g)
    lengths = torch.tensor([width, width - 100, 20][:rows], dtype=torch.int32)
    out = torch.full((rows, k), 7, dtype=torch.int32)
    return check_call(logits, lengths, 1, k, out)


@pytest.mark.parametrize("split", [1, 2])
def test_compaction_alone_lists_every_position_at_or_above_a_threshold(split):
    call = _call()
    entries, counts = triton_sample.launch(call, split=split, stop_after="compaction")
    parts = triton_sample.listed_positions(entries)
    assert parts.shape[:2] == counts.shape == (3, split)
    for row, n in enumerate(call.lengths.tolist()):
        listed = torch.cat([parts[row, part, :counts[row, part]] for part in range(split)]).long()
        if n <= call.k:  # written whole by the full kernel: no seed, no list
            assert counts[row].sum() == 0
            continue
        values = call.logits[row, :n]
        assert len(listed) >= call.k and len(set(listed.tolist())) == len(listed)
        threshold = values[listed].min()
        assert sorted(listed.tolist()) == torch.nonzero(values >= threshold).flatten().tolist()
    assert torch.all(call.out == 7)  # nothing written


def test_seed_alone_lists_nothing_and_writes_nothing():
    call = _call()
    _, counts = triton_sample.launch(call, split=1, stop_after="seed")
    assert torch.all(counts == 0) and torch.all(call.out == 7)


def test_stop_after_names_the_phases():
    with pytest.raises(ValueError, match=r"stop_after must be one of \('seed', 'compaction'\) or None, got 'finish'"):
        triton_sample.launch(_call(), stop_after="finish")


def test_the_tool_prints_a_row_per_shape_and_knobs(capsys):
    assert topk_phases.main(["--device", "cpu", "--shapes", "2x600", "--knobs", "64/4", "--k", "16",
                             "--replays", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == topk_phases.HEADER and len(lines) == 2
    row = dict(zip(lines[0].split(","), lines[1].split(",")))
    assert (row["rows"], row["width"], row["k"], row["BLOCK"], row["num_warps"]) == ("2", "600", "16", "64", "4")
    assert int(row["list_min"]) >= 16 and float(row["below_k"]) == 0.0
    assert all(float(row[c]) > 0 for c in ("seed_us", "whole_us", "radix_us"))


@pytest.mark.parametrize("shapes", ["64-8192", "64x8192x2"])
def test_the_tool_rejects_malformed_shapes(shapes):
    with pytest.raises(SystemExit, match=f"expected comma-separated AxB integer pairs, got '{shapes}'"):
        topk_phases.main(["--device", "cpu", "--shapes", shapes])


def test_the_tool_marks_rows_held_whole(capsys):
    """Rows no longer than a compaction step are selected whole in registers: no list to measure."""
    assert topk_phases.main(["--device", "cpu", "--shapes", "2x60", "--knobs", "64/4", "--k", "16",
                             "--replays", "1"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[1].endswith(",held,held,held,-")
