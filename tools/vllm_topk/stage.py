"""Copy the vLLM sources that define the top-k entry points, and the headers they include, from a
git dir (one revision) into a folder; write ``manifest.json`` with each entry point's file, C++
signature and tensor ABI, which ``build.py`` binds. Run through ``tools/stage_vllm_topk.sh``.

Older vLLM takes ``torch::Tensor`` (ABI "aten"); from the libtorch stable ABI migration on, the
entry points take ``torch::stable::Tensor`` (ABI "stable") and the extension is compiled with the
``TORCH_TARGET_VERSION`` that vLLM's CMakeLists.txt sets, which the manifest records."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

ENTRY_POINTS = ("top_k_per_row_decode", "persistent_topk")
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
_TARGET_VERSION = re.compile(r"TORCH_TARGET_VERSION=(0x[0-9A-Fa-f]+U?L{0,2})")


def git(gitdir: str, *args: str) -> str:
    return subprocess.run(["git", "-C", gitdir, *args], check=True, capture_output=True, text=True).stdout


def exists(gitdir: str, rev: str, path: str) -> bool:
    return subprocess.run(["git", "-C", gitdir, "cat-file", "-e", f"{rev}:{path}"], capture_output=True).returncode == 0


def defining_file(gitdir: str, rev: str, name: str) -> str | None:
    """The first ``.cu`` file under csrc/ with a top-level ``void name(`` definition."""
    try:
        hits = git(gitdir, "grep", "-l", "-E", rf"^void {name}\(", rev, "--", "csrc")
    except subprocess.CalledProcessError:
        return None
    files = sorted(line.split(":", 1)[1] for line in hits.splitlines() if line.endswith(".cu"))
    return files[0] if files else None


def signature(source: str, name: str) -> str:
    """``void name(...)`` as the definition spells it (balanced parentheses, whitespace folded)."""
    start = re.search(rf"^void {name}\(", source, re.M).start()
    depth, i = 0, source.index("(", start)
    for i in range(i, len(source)):
        depth += {"(": 1, ")": -1}.get(source[i], 0)
        if depth == 0:
            break
    text = source[start:i + 1]
    text = re.sub(r"//[^\n]*", "", text)
    return " ".join(text.split())


def abi(signature_text: str) -> str | None:
    """"stable" for ``torch::stable::Tensor`` parameters, "aten" for ``torch::Tensor``/``at::Tensor``."""
    if "torch::stable::Tensor" in signature_text:
        return "stable"
    if re.search(r"\b(torch|at)::Tensor\b", signature_text):
        return "aten"
    return None


def target_version(gitdir: str, rev: str) -> str | None:
    """The ``TORCH_TARGET_VERSION`` vLLM's top-level CMakeLists.txt compiles its stable extension
    with (the oldest torch whose C shims it may use), or None where there is none."""
    if not exists(gitdir, rev, "CMakeLists.txt"):
        return None
    found = _TARGET_VERSION.findall(git(gitdir, "show", f"{rev}:CMakeLists.txt"))
    return found[0] if found else None


def include_candidates(path: str, name: str, search: str) -> list[str]:
    """Where ``#include "name"`` in ``path`` may point: next to the includer, then under ``search``."""
    return [os.path.normpath(os.path.join(os.path.dirname(path), name)), os.path.join(search, name)]


def include_closure(gitdir: str, rev: str, roots: list[str], search: str = "csrc") -> tuple[list[str], list]:
    """Every quoted include reachable from ``roots`` (:func:`include_candidates`: next to the includer,
    then under ``search``); returns the files, in the order found, and the includes found nowhere
    (system or generated headers) as ``(includer, name)`` pairs."""
    files, missing, queue = [], [], list(roots)
    while queue:
        path = queue.pop(0)
        if path in files:
            continue
        files.append(path)
        for name in _INCLUDE.findall(git(gitdir, "show", f"{rev}:{path}")):
            found = next((c for c in include_candidates(path, name, search) if exists(gitdir, rev, c)), None)
            if found is None:
                missing.append((path, name))
            elif found not in files:
                queue.append(found)
    return files, missing


def release(gitdir: str, rev: str) -> str:
    """vLLM's version at ``rev``: an sdist's ``PKG-INFO`` (an sdist put under git has no tags),
    else ``git describe`` of a clone (the nearest tag, or the commit)."""
    if exists(gitdir, rev, "PKG-INFO"):
        for line in git(gitdir, "show", f"{rev}:PKG-INFO").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return git(gitdir, "describe", "--tags", "--always", rev).strip()


def stage(gitdir: str, dest: str, rev: str = "HEAD") -> dict:
    commit = git(gitdir, "rev-parse", rev).strip()
    entries = {}
    for name in ENTRY_POINTS:
        path = defining_file(gitdir, commit, name)
        if path is None:
            print(f"note: no csrc/*.cu defines `void {name}(` at {commit[:12]}; not staged", file=sys.stderr)
            continue
        text = signature(git(gitdir, "show", f"{commit}:{path}"), name)
        kind = abi(text)
        if kind is None:
            print(f"note: {name} in {path} takes no torch tensor build.py can bind: {text}; not staged",
                  file=sys.stderr)
            continue
        entries[name] = {"file": path, "signature": text, "abi": kind}
    if not entries:
        raise SystemExit(f"stage: none of {', '.join(ENTRY_POINTS)} found at {commit[:12]}")
    files, missing = include_closure(gitdir, commit, sorted({e["file"] for e in entries.values()}))
    for path in files:
        target = os.path.join(dest, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w") as f:
            f.write(git(gitdir, "show", f"{commit}:{path}"))
    manifest = {"revision": commit, "version": release(gitdir, commit), "entry_points": entries, "files": files,
                "unresolved_includes": [f"{path}: {name}" for path, name in missing]}
    if any(e["abi"] == "stable" for e in entries.values()):
        manifest["torch_target_version"] = target_version(gitdir, commit)
    with open(os.path.join(dest, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"staged {len(files)} files of vLLM {commit[:12]} into {dest}: " + ", ".join(files))
    return manifest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("gitdir")
    p.add_argument("dest")
    p.add_argument("--rev", default="HEAD")
    a = p.parse_args(argv)
    stage(a.gitdir, a.dest, a.rev)
    return 0


if __name__ == "__main__":
    sys.exit(main())
