"""``tools/topk_ab.py`` on CPU tensors (the interpreter): the revision's module loads beside the package's, every
variant's selection is exact, and bad arguments name the flag."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import topk_ab  # noqa: E402


def _in_git() -> bool:
    return subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, check=False).returncode == 0


@pytest.mark.skipif(not _in_git(), reason="needs the repository's git history")
def test_ab_rows_on_cpu(capsys):
    assert topk_ab.main(["--baseline", "HEAD", "--device", "cpu", "--shapes", "2x300", "--dtypes", "fp32,bf16",
                         "--knobs", "128/4", "--k", "16"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == topk_ab.HEADER and len(lines) == 1 + 2 * 3
    rows = [line.split(",") for line in lines[1:]]
    assert [r[3] for r in rows[:3]] == ["baseline", "current", "128/4"] and {r[2] for r in rows} == {"fp32", "bf16"}
    assert all(r[6] == "True" for r in rows) and all(r[5] == "1.000" for r in rows if r[3] == "baseline")


@pytest.mark.skipif(not _in_git(), reason="needs the repository's git history")
def test_paired_knob_sets_time_the_baseline_too(capsys):
    """``--paired``: each knob set on the baseline, then on the current module, whose ratio is against that row."""
    assert topk_ab.main(["--baseline", "HEAD", "--device", "cpu", "--shapes", "2x300", "--knobs", "128/4,64/4",
                         "--paired", "--k", "16"]) == 0
    rows = [line.split(",") for line in capsys.readouterr().out.strip().splitlines()[1:]]
    assert [r[3] for r in rows] == ["baseline", "current", "baseline 128/4", "128/4", "baseline 64/4", "64/4"]
    us = {r[3]: float(r[4]) for r in rows}
    ratio = {r[3]: float(r[5]) for r in rows}
    assert ratio["baseline 128/4"] == ratio["baseline 64/4"] == 1.0 and all(r[6] == "True" for r in rows)
    for knobs in ("128/4", "64/4"):
        assert ratio[knobs] == pytest.approx(us[f"baseline {knobs}"] / us[knobs], abs=2e-3, rel=2e-2)


@pytest.mark.skipif(not _in_git(), reason="needs the repository's git history")
def test_baseline_module_is_its_own():
    import tempfile

    from paged_mqa_logits.top_k import triton_sample

    with tempfile.TemporaryDirectory() as directory:
        module = topk_ab.load_revision("HEAD", directory)
        assert module is not triton_sample and module.__name__ == "triton_sample_baseline"
        assert module.launch is not triton_sample.launch


@pytest.mark.parametrize("argv, fragment", [
    (["--baseline", "no-such-revision-xyz"], "--baseline: no paged_mqa_logits/top_k/triton_sample.py"),
    (["--baseline", "HEAD", "--knobs", "2048"], "--knobs: expected comma-separated A/B"),
    (["--baseline", "HEAD", "--shapes", "64x"], "--shapes: expected comma-separated AxB"),
    (["--baseline", "HEAD", "--dtypes", "fp16"], "--dtypes"),
])
def test_bad_arguments_name_the_flag(argv, fragment):
    with pytest.raises(SystemExit, match=fragment):
        topk_ab.main(argv + ["--device", "cpu"])
