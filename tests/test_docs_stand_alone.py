"""The repository stands alone: no file points at documents outside it or at issue numbers of
a tracker it does not ship. Docs, docstrings and CSV headers cite files of the repository
(docs/CONTRACT.md, docs/BENCHMARK.md, ...)."""

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Spelled in pieces so that this file does not match itself.
FORBIDDEN = [
    ("a document outside the repository", re.compile("BRI" + "EF")),
    ("a path outside the repository", re.compile(re.escape(".." + "/shared"))),
    ("an issue number", re.compile("iss" + r"ue[ -]#?[0-9]", re.IGNORECASE)),
]


def tracked_files():
    listing = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
    return [name for name in listing.splitlines() if os.path.isfile(os.path.join(ROOT, name))]


def test_no_outside_references():
    hits = []
    for name in tracked_files():
        with open(os.path.join(ROOT, name), encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                for what, pattern in FORBIDDEN:
                    if pattern.search(line):
                        hits.append(f"{name}:{lineno}: {what}: {line.strip()[:120]}")
    assert not hits, "\n".join(hits)


def test_the_cited_docs_exist():
    for name in ("docs/CONTRACT.md", "docs/BENCHMARK.md"):
        assert os.path.isfile(os.path.join(ROOT, name)), name
    cited = set()
    for name in tracked_files():
        if name.endswith((".py", ".md", ".csv", ".toml", ".txt")) or name == ".ci/run":
            with open(os.path.join(ROOT, name), encoding="utf-8", errors="replace") as f:
                cited.update(re.findall(r"\bdocs/[A-Z_]+\.md\b", f.read()))
    missing = sorted(d for d in cited if not os.path.isfile(os.path.join(ROOT, d)))
    assert not missing, missing
