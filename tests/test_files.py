"""Output files are written all or nothing (paged_mqa_logits/files.py), through a symbolic link
to its target, and no module of the package or the tuner opens a file for writing any other
way."""

import ast
import os

import pytest

from paged_mqa_logits.files import atomic_write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: modules with their own atomic writer (the kernel cache's manifest: its package imports nothing
#: of the rest of paged_mqa_logits)
OWN_WRITERS = {"paged_mqa_logits/files.py", "paged_mqa_logits/triton_internals/cache_overlay.py"}
#: functions that write scratch files into a private temporary directory (nobody reads them
#: but the process that writes them): (module, function) -> what they write
SCRATCH_WRITERS = {
    ("paged_mqa_logits/backends/flydsl/build.py", "_linker_stand_in"): "the linker stand-in script",
    ("paged_mqa_logits/backends/flydsl/build.py", "compile_plans"): "the workers' plan lists and logs",
}


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("old\n")
    with pytest.raises(RuntimeError, match="interrupted"):
        with atomic_write(str(path)) as f:
            f.write("half of the new")
            raise RuntimeError("interrupted")
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["t.csv"]
    with atomic_write(str(path), "wb") as f:
        f.write(b"new\n")
    assert path.read_bytes() == b"new\n" and os.listdir(tmp_path) == ["t.csv"]


def test_a_symbolic_link_is_written_through(tmp_path):
    target = tmp_path / "data" / "t.csv"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "link.csv"
    link.symlink_to(os.path.relpath(target, tmp_path))
    with atomic_write(str(link)) as f:
        f.write("new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    assert os.listdir(target.parent) == ["t.csv"]


def _writes_in_place(node) -> bool:
    """``open(path, "w"...)`` / ``open(path, "wb")`` / ``open(path, "a")``: a write that is not atomic."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open"):
        return False
    modes = [a for a in node.args[1:2]] + [k.value for k in node.keywords if k.arg == "mode"]
    return any(isinstance(m, ast.Constant) and isinstance(m.value, str) and set(m.value) & set("wax")
               for m in modes)


def test_no_module_writes_a_file_in_place():
    offenders = []
    for package in ("paged_mqa_logits", "tuner"):
        for folder, _, names in os.walk(os.path.join(ROOT, package)):
            for name in (n for n in names if n.endswith(".py")):
                path = os.path.join(folder, name)
                relative = os.path.relpath(path, ROOT).replace(os.sep, "/")
                if relative in OWN_WRITERS:
                    continue
                tree = ast.parse(open(path).read())
                scratch = {id(node) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                           and (relative, f.name) in SCRATCH_WRITERS for node in ast.walk(f)}
                offenders += [f"{relative}:{node.lineno}" for node in ast.walk(tree)
                              if _writes_in_place(node) and id(node) not in scratch]
    assert not offenders, offenders
