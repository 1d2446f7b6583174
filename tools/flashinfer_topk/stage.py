"""Copy the FlashInfer headers our binding includes (``<flashinfer/topk.cuh>``, and
``<flashinfer/math.cuh>``, which topk.cuh uses without including it), every header they include
with quotes and FlashInfer's LICENSE from a git dir (one revision) into a folder, with our binding
(``binding.cu``), its ctypes wrapper (``flashinfer_topk_staged.py``) and ``build.py``; write
``manifest.json`` (version, revision, files, the signature of the entry ``binding.cu`` calls).
Run through ``tools/stage_flashinfer_topk.sh``.

The folder is written whole or not at all: everything goes to a temporary folder beside DEST first,
which then replaces DEST (an earlier staging only; any other existing folder is refused)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
# vLLM's stager's git plumbing and include walk (found through the sys.path entry above)
from vllm_topk import stage as vllm_stage
from vllm_topk.stage import exists, git

ENTRY_HEADER = "include/flashinfer/topk.cuh"
#: the function binding.cu calls: FlashInfer's ragged transform takes each row's length (the
#: decode rows' ragged prefixes), and with zero offsets writes plain positions
ENTRY = "TopKRaggedTransformDispatch"
OURS = ("binding.cu", "build.py", "flashinfer_topk_staged.py")
_FLASHINFER_INCLUDE = re.compile(r"^\s*#\s*include\s+<(flashinfer/[^>]+)>", re.MULTILINE)


class StageError(SystemExit):
    """A refusal with its reason (exit status 1 and the message on stderr, as SystemExit prints it)."""

    def __init__(self, message: str):
        super().__init__(f"stage_flashinfer_topk: {message}")


def _build_module():
    """Our build.py (it knows which signatures binding.cu can call)."""
    spec = importlib.util.spec_from_file_location("flashinfer_topk_build", os.path.join(HERE, "build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def binding_roots(binding: str = os.path.join(HERE, "binding.cu")) -> list[str]:
    """The FlashInfer headers ``binding`` includes (``<flashinfer/...>``), as paths of the tree."""
    with open(binding) as f:
        return [f"include/{name}" for name in _FLASHINFER_INCLUDE.findall(f.read())]


def include_closure(gitdir: str, rev: str, roots: list[str]) -> list[str]:
    """``roots`` and every header reachable from them by quoted includes, each resolved next to its
    includer, then under include/ (as FlashInfer's ``-I include`` does; vLLM's stager's walk); a root or
    quoted include found nowhere is an error (other angle includes come from the CUDA toolkit and the C++
    library)."""
    for root in roots:
        if not exists(gitdir, rev, root):
            raise StageError(f"binding.cu includes <{root[len('include/'):]}>, but {root} is missing at {rev[:12]}")
    files, missing = vllm_stage.include_closure(gitdir, rev, roots, "include")
    if missing:
        path, name = missing[0]
        near, under = vllm_stage.include_candidates(path, name, "include")
        raise StageError(f'{path} includes "{name}", found neither as {near} nor as {under} at {rev[:12]}')
    return files


def release(gitdir: str, rev: str) -> str:
    """FlashInfer's version at ``rev``: its ``version.txt``, else ``git describe`` (tag or commit)."""
    if exists(gitdir, rev, "version.txt"):
        return git(gitdir, "show", f"{rev}:version.txt").strip()
    return git(gitdir, "describe", "--tags", "--always", rev).strip()


def entry_signature(header: str) -> str | None:
    """``cudaError_t TopKRaggedTransformDispatch(...)`` as topk.cuh spells it (balanced parentheses,
    comments dropped, whitespace folded), or None where the header does not define it."""
    match = re.search(rf"^cudaError_t {ENTRY}\(", header, re.MULTILINE)
    if match is None:
        return None
    depth = 0
    for end in range(header.index("(", match.start()), len(header)):
        depth += {"(": 1, ")": -1}.get(header[end], 0)
        if depth == 0:
            break
    text = re.sub(r"//[^\n]*", "", header[match.start():end + 1])
    return " ".join(text.split())


def resolve(gitdir: str, rev: str) -> str:
    """The commit ``rev`` names in ``gitdir``; a clear error for a folder that is not a git dir or a
    revision it does not have."""
    if not os.path.isdir(gitdir):
        raise StageError(f"FLASHINFER_GITDIR: expected a git directory, got {gitdir!r} (no such directory)")
    try:
        git(gitdir, "rev-parse", "--git-dir")
    except subprocess.CalledProcessError:
        raise StageError(f"FLASHINFER_GITDIR: expected a git directory, got {gitdir!r}") from None
    try:
        return git(gitdir, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
    except subprocess.CalledProcessError:
        raise StageError(f"FLASHINFER_REV: expected a revision of {gitdir}, got {rev!r}") from None


def stage(gitdir: str, dest: str, rev: str = "HEAD") -> dict:
    commit = resolve(gitdir, rev)
    if not exists(gitdir, commit, ENTRY_HEADER):
        raise StageError(f"{ENTRY_HEADER} is missing at {commit[:12]} (FlashInfer's top-k lives there)")
    text = entry_signature(git(gitdir, "show", f"{commit}:{ENTRY_HEADER}"))
    if text is None:
        raise StageError(f"{ENTRY_HEADER} defines no `cudaError_t {ENTRY}(` at {commit[:12]} "
                         "(the ragged transform binding.cu calls)")
    build = _build_module()
    try:
        names = build.parameter_names(text)
        build.binding_defines(names)  # refuses a signature binding.cu cannot call
    except ValueError as exc:
        raise StageError(f"{ENTRY} at {commit[:12]}: {exc}") from None
    files = include_closure(gitdir, commit, binding_roots())
    files += ["LICENSE"] if exists(gitdir, commit, "LICENSE") else []  # Apache-2.0: kept with the code
    manifest = {"version": release(gitdir, commit), "revision": commit,
                "entry": {"name": ENTRY, "file": ENTRY_HEADER, "signature": text, "parameters": names},
                "files": files}

    dest = os.path.abspath(dest)
    if os.path.isdir(dest) and os.listdir(dest) and not os.path.isfile(os.path.join(dest, "manifest.json")):
        raise StageError(f"DEST: expected a new folder or an earlier staging (with manifest.json), got {dest!r}")
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise StageError(f"DEST: expected a folder, got the file {dest!r}")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    work = tempfile.mkdtemp(prefix=".staging-", dir=os.path.dirname(dest))
    try:
        for path in files:
            target = os.path.join(work, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w") as f:
                f.write(git(gitdir, "show", f"{commit}:{path}"))
        for name in OURS:
            shutil.copy(os.path.join(HERE, name), os.path.join(work, name))
        with open(os.path.join(work, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
        if os.path.isdir(dest):  # an earlier staging (its build/ too): replaced whole
            old = dest + ".old"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(dest, old)
            os.rename(work, dest)
            shutil.rmtree(old)
        else:
            os.rename(work, dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    print(f"staged FlashInfer {manifest['version']} ({commit[:12]}) into {dest}: " + ", ".join(files))
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
