"""No prose line in docs/ (or benchmarks/README.md) runs past 120 characters: tables and fenced
code blocks aside, a long line is prose someone will have to scroll."""

from __future__ import annotations

import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_PROSE = 120


def long_prose_lines(text: str) -> list[int]:
    """Line numbers (1-based) of prose lines over :data:`MAX_PROSE` characters."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and not line.lstrip().startswith("|") and len(line) > MAX_PROSE:
            out.append(number)
    return out


def test_no_prose_line_in_docs_is_over_120_characters():
    paths = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "benchmarks", "README.md")]
    assert len(paths) > 1
    found = {os.path.relpath(p, ROOT): long_prose_lines(open(p).read()) for p in paths}
    assert not any(found.values()), {p: lines for p, lines in found.items() if lines}


def test_a_long_prose_line_is_found_and_tables_and_code_are_not():
    long = "word " * 30
    text = f"short\n{long}\n| {long} |\n```\n{long}\n```\n"
    assert long_prose_lines(text) == [2]
