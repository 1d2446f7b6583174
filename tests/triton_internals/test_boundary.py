"""Only ``paged_mqa_logits/triton_internals/`` touches Triton's internals.

Every Python file of the repository outside that package (and outside these tests of it) is
scanned for: Triton's private modules named anywhere in the text (``triton._C``,
``triton.runtime``, ``triton.compiler``, ``triton.backends``, ``triton.<...>._private``);
imports of ``_private`` names from Triton; ``_private`` attributes of Triton modules; Triton
objects patched (attribute assignments or deletions on Triton modules, classes and their
members, ``setattr``/``delattr`` on them, ``monkeypatch.setattr`` on Triton); the JIT's internal state (``device_caches``, ``params``, ...); and stand-in Triton
drivers (classes implementing the driver protocol). ``triton.knobs`` is Triton's public
configuration API: setting knobs is allowed.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("paged_mqa_logits", "tests", "tools", "tuner", "benchmarks")
EXEMPT = ("paged_mqa_logits/triton_internals/", "tests/triton_internals/")

#: private Triton modules (anywhere in the text: imports, strings handed to subprocesses, ...)
PRIVATE_MODULE = re.compile(r"\btriton\.(?:_C|runtime|compiler|backends)\b|\btriton(?:\.[A-Za-z]\w*)*\._[A-Za-z]\w*")
#: attributes that are the JIT's or the driver's internal state, whatever object holds them
JIT_INTERNALS = frozenset({"device_caches", "create_binder", "params", "is_constexpr", "do_not_specialize",
                           "do_not_specialize_on_alignment", "launcher_cls", "set_active", "native_specialize_impl"})
#: Triton classes whose members must not be replaced outside the internals package
TRITON_CLASSES = frozenset({"JITFunction", "GluonJITFunction", "InterpretedFunction", "CompiledKernel",
                            "InterpreterBuilder", "KernelInterface"})
#: methods only a stand-in Triton driver defines
DRIVER_PROTOCOL = frozenset({"get_current_target", "get_active_torch_device", "load_binary",
                             "get_device_properties"})


def _triton_names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Local names bound to Triton modules or objects by imports, and those bound to ``knobs``."""
    names, knobs = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "triton":
                    names.add(alias.asname or "triton")
                    if alias.name == "triton.knobs" and alias.asname:
                        knobs.add(alias.asname)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "triton":
            for alias in node.names:
                names.add(alias.asname or alias.name)
                if alias.name == "knobs":
                    knobs.add(alias.asname or alias.name)
    return names, knobs


def _chain(node: ast.AST) -> list[str]:
    """``a.b.c`` -> ["a", "b", "c"] (empty when the root is not a plain name)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else []


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def violations_in(source: str, where: str = "<source>") -> list[str]:
    """What in ``source`` touches Triton's internals (one line per finding)."""
    found = [f"{where}:{source.count(chr(10), 0, m.start()) + 1}: names private module {m.group(0)!r}"
             for m in PRIVATE_MODULE.finditer(source)]
    tree = ast.parse(source)
    triton, knobs = _triton_names(tree)

    def report(node, what):
        found.append(f"{where}:{node.lineno}: {what}")

    # loop variables over Triton objects (``for module in (tl, tl.math): setattr(module, ...)``)
    over_triton = {target.id for loop in ast.walk(tree) if isinstance(loop, (ast.For, ast.comprehension))
                   for target in ast.walk(loop.target) if isinstance(target, ast.Name)
                   if any(isinstance(n, ast.Name) and n.id in triton for n in ast.walk(loop.iter))}

    def is_triton_chain(chain):
        return bool(chain) and (chain[0] in triton or any(part in TRITON_CLASSES for part in chain))

    def is_knob(chain):
        return bool(chain) and (chain[0] in knobs or (chain[0] in triton and chain[1:2] == ["knobs"]))

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "triton":
            for alias in node.names:
                if _private(alias.name):
                    report(node, f"imports private name {alias.name!r} from {node.module}")
        elif isinstance(node, ast.Attribute):
            chain = _chain(node)
            if node.attr in JIT_INTERNALS:
                report(node, f"reads the JIT's internal {node.attr!r}")
            elif chain and chain[0] in triton and _private(node.attr):
                report(node, f"reads private attribute {'.'.join(chain)}")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                for element in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    chain = _chain(element)
                    if isinstance(element, ast.Attribute) and is_triton_chain(chain) and not is_knob(chain):
                        report(node, f"patches {'.'.join(chain)}")
        elif isinstance(node, ast.Call):
            func = _chain(node.func)
            args = node.args
            strings = [a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if func[-1:] in (["getattr"], ["hasattr"], ["setattr"], ["delattr"]):
                for text in strings:
                    if text in JIT_INTERNALS:
                        report(node, f"reads the JIT's internal {text!r}")
            if func in (["setattr"], ["delattr"]) and args and (is_triton_chain(_chain(args[0]))
                                                               or _chain(args[0])[:1] in [[n] for n in over_triton]):
                report(node, f"{func[0]} on a Triton object")
            if func[-2:] == ["monkeypatch", "setattr"] and args and (
                    is_triton_chain(_chain(args[0])) or (strings and strings[0].startswith("triton."))):
                report(node, "monkeypatches Triton")
        elif isinstance(node, ast.FunctionDef) and node.name in DRIVER_PROTOCOL:
            report(node, f"defines {node.name}: a stand-in Triton driver")
    return found


def scanned_files(root: Path) -> list[Path]:
    files = []
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if not relative.startswith(EXEMPT):
                files.append(path)
    return files


def test_nothing_outside_the_internals_package_touches_triton_internals():
    files = scanned_files(REPO)
    assert len(files) > 50  # the scan sees the repository
    found = [v for path in files for v in violations_in(path.read_text(), path.relative_to(REPO).as_posix())]
    assert not found, "Triton internals outside paged_mqa_logits/triton_internals:\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    "from triton._C.libtriton import native_specialize_impl\n",
    "import triton.runtime.build as build\n",
    "from triton.runtime.jit import JITFunction\n",
    "from triton.compiler.compiler import ASTSource\n",
    "from triton.backends.nvidia import driver\n",
    "from triton.experimental.gluon._runtime import GluonASTSource\n",
    "SCRIPT = 'from triton.runtime.driver import driver'\n",
    "from triton.language import _semantic\n",
    "import triton.language as tl\nx = tl.core._unwrap_if_constexpr\n",
    "import triton.language as tl\ntl.max = None\n",
    "import triton.language as tl\nfor m in (tl, tl.math):\n    setattr(m, 'max', None)\n",
    "from .internals import JITFunction\nJITFunction.run = lambda *a, **k: None\n",
    "import triton\ndef test(monkeypatch):\n    monkeypatch.setattr(triton, '__version__', '3.10')\n",
    "def f(kernel):\n    kernel.device_caches.clear()\n",
    "def f(kernel):\n    return getattr(kernel, 'device_caches', {})\n",
    "def f(fn):\n    return [p.name for p in fn.params if not p.is_constexpr]\n",
    "class Driver:\n    def get_current_target(self):\n        return None\n",
])
def test_the_scan_finds_each_kind_of_access(source):
    assert violations_in(source), source


def test_the_scan_allows_public_triton():
    source = ("import triton\nimport triton.language as tl\nfrom triton import knobs\n"
              "from triton.experimental import gluon\nfrom triton.experimental.gluon import language as gl\n"
              "knobs.cache.dir = '/tmp/x'\ndel knobs.cache.manager_class\ntriton.knobs.compilation.listener = None\n"
              "def f(src, target):\n    return triton.compile(src, target=target), triton.__version__, tl.float32\n"
              "def g(record, values):\n    for key, value in values.items():\n        setattr(record, key, value)\n")
    assert violations_in(source) == []


def test_the_internals_package_imports_nothing_else_of_the_package():
    """So that a script can load it by path without importing the package (and torch)."""
    package = REPO / "paged_mqa_logits" / "triton_internals"
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        outside = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                   and (node.level > 1 or (node.level == 0 and (node.module or "").startswith("paged_mqa_logits")))]
        assert not outside, f"{path.name} imports {outside}"


if __name__ == "__main__":  # scan another checkout: python test_boundary.py /path/to/checkout
    import sys

    root = Path(sys.argv[1]).resolve()
    for path in scanned_files(root):
        for line in violations_in(path.read_text(), os.path.relpath(path, root)):
            print(line)
