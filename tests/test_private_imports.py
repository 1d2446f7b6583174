"""No module of ours imports another module's private names.

A leading underscore says "this module's own"; a ``from X import _name`` from another module of the
package breaks that promise silently: the owner renames or changes ``_name`` as its own, and the
importer breaks. A name two modules share is public (no underscore, a docstring or comment saying
what it is for). Only the package's own modules count (``paged_mqa_logits`` and ``tuner``); private
names of third-party packages (Triton's, FlyDSL's) are out of scope. Dunders are not private.
"""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("paged_mqa_logits", "tuner")

#: ``module: name from X`` violations left in place, each with why. Empty now: every shared name
#: is public. An entry belongs here only while the module that owns the name (or imports it) may
#: not be edited, e.g. while another change is rewriting it.
ALLOWED: dict[str, str] = {}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(root: str, path: str) -> tuple[str, bool]:
    """The dotted name of the module at ``path`` (under ``root``) and whether it is a package."""
    parts = os.path.relpath(path, root)[: -len(".py")].split(os.sep)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join(parts), is_package


def _imported_module(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute dotted name ``node`` imports from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports(root: str, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Every ``from X import _name`` in the modules of ``packages`` (directories under ``root``)
    where ``X`` is a module of one of ``packages``, as ``module: name from X``."""
    found = []
    for package in packages:
        for directory, _, files in sorted(os.walk(os.path.join(root, package))):
            for file in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(directory, file)
                module, is_package = _module_name(root, path)
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read(), path)
                for node in ast.walk(tree):
                    if not isinstance(node, ast.ImportFrom):
                        continue
                    source = _imported_module(node, module, is_package)
                    if source.split(".")[0] not in packages:
                        continue
                    found += [f"{module}: {alias.name} from {source}" for alias in node.names
                              if _is_private(alias.name)]
    return sorted(found)


def test_no_module_imports_another_modules_private_names():
    found = private_imports(ROOT)
    assert not [v for v in found if v not in ALLOWED], "\n".join(v for v in found if v not in ALLOWED)
    # an allowed violation that is gone must leave the list, so the list never outlives its reason
    assert not set(ALLOWED) - set(found), sorted(set(ALLOWED) - set(found))


def test_the_checker_finds_a_planted_violation(tmp_path):
    """The check itself cannot silently pass: a fake package with each form of the violation
    (relative, absolute, from a subpackage, inside a function) and the allowed forms beside them."""
    package = tmp_path / "fakepkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from .owner import public\n")
    (package / "owner.py").write_text("def _secret():\n    pass\n\n\ndef public():\n    pass\n")
    (package / "user.py").write_text(
        "from .owner import _secret, public\n"
        "from fakepkg.owner import _secret as also\n"
        "from os import _exit\n"             # third party / standard library: out of scope
        "from .owner import __doc__\n")      # a dunder is not private
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "deep.py").write_text(
        "def lazy():\n    from ..owner import _secret\n    return _secret\n")
    assert private_imports(str(tmp_path), ("fakepkg",)) == [
        "fakepkg.sub.deep: _secret from fakepkg.owner",
        "fakepkg.user: _secret from fakepkg.owner",
        "fakepkg.user: _secret from fakepkg.owner",
    ]
