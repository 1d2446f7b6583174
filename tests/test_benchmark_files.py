"""benchmarks/ holds results, each listed in benchmarks/README.md with what produced it, and the
docs cite only results that are there."""

from __future__ import annotations

import glob
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
#: a result file named in backticks, with or without its benchmarks/ folder
CITED = re.compile(r"`(?:benchmarks/)?((?:h100|h200|amd)/)?([\w.-]+\.(?:csv|log|txt))`")


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "benchmarks"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [os.path.relpath(p, "benchmarks") for p in out.stdout.split()]


def test_every_result_is_listed_in_the_benchmarks_readme():
    readme = open(os.path.join(BENCH, "README.md")).read()
    files = [f for f in _tracked() if f != "README.md"]
    assert files
    unlisted = [f for f in files if f"`{f}`" not in readme and os.path.basename(f) not in readme]
    assert not unlisted, unlisted


def missing_citations(text: str, names: set[str]) -> list[str]:
    """Result files ``text`` cites (in backticks) that are not among ``names`` (tables aside)."""
    return [name for folder, name in CITED.findall(text)
            if ("_" in name or folder) and name not in names and not name.endswith(("_tuned.csv", "_untuned.csv"))
            and not os.path.exists(os.path.join(ROOT, "configs", name))]


def test_the_docs_cite_only_results_that_exist():
    names = {os.path.basename(f) for f in _tracked()}
    texts = glob.glob(os.path.join(ROOT, "docs", "*.md")) + [os.path.join(BENCH, "README.md")]
    missing = {os.path.relpath(p, ROOT): missing_citations(open(p).read(), names) for p in texts}
    assert not any(missing.values()), missing


def test_a_citation_of_a_deleted_result_is_found():
    names = {os.path.basename(f) for f in _tracked()}
    assert "bench_grid_uniform.csv" in names
    text = "kept (`bench_grid_uniform.csv`), gone (`benchmarks/h200/diag_h64_n4_epilogue_full.csv`)"
    assert missing_citations(text, names) == ["diag_h64_n4_epilogue_full.csv"]
