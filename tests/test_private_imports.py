"""No module of ours uses another module's private names.

A leading underscore says "this module's own"; a ``from X import _name`` from another module of the
package, or an ``X._name`` through a module alias (``from . import X``, ``import a.X as x``), breaks
that promise silently: the owner renames or changes ``_name`` as its own, and the user breaks. A
name two modules share is public (no underscore, a docstring or comment saying what it is for).
Only the package's own modules count (``paged_mqa_logits`` and ``tuner``); private names of
third-party packages (Triton's, FlyDSL's, ``torch._C``) are out of scope. Dunders are not private.
"""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("paged_mqa_logits", "tuner")

#: ``module: name from X`` violations left in place, each with why. Empty now: every shared name
#: is public. An entry belongs here only while the module that owns the name (or uses it) may
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


def _is_our_module(root: str, dotted: str, packages: tuple[str, ...]) -> bool:
    """Whether ``dotted`` names a module or subpackage file of ours: only then is an alias of it a
    module alias (``from . import common`` is; ``from .ops import launch``, a function, is not)."""
    if dotted.split(".")[0] not in packages:
        return False
    path = os.path.join(root, *dotted.split("."))
    return os.path.isfile(path + ".py") or os.path.isfile(os.path.join(path, "__init__.py"))


def _module_aliases(tree: ast.AST, module: str, is_package: bool, root: str,
                    packages: tuple[str, ...]) -> dict[str, str]:
    """Names the module binds to one of our modules, mapped to that module's dotted name. The
    whole file counts, imports inside functions too, as ``private_imports`` counts them."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                # ``import a.b.c`` binds ``a`` (its attribute chain is resolved where it is used);
                # ``import a.b.c as x`` binds ``x`` to ``a.b.c``
                name, target = ((alias.asname, alias.name) if alias.asname
                                else (alias.name.split(".")[0], alias.name.split(".")[0]))
                if _is_our_module(root, target, packages):
                    aliases[name] = target
        elif isinstance(node, ast.ImportFrom):
            source = _imported_module(node, module, is_package)
            for alias in node.names:
                if _is_our_module(root, f"{source}.{alias.name}", packages):
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
    return aliases


def _module_of(node: ast.expr, aliases: dict[str, str], root: str,
               packages: tuple[str, ...]) -> str | None:
    """The dotted name of our module that ``node`` denotes (``wg``, ``a.b.c``), else None: a
    local object (``self``) or a third-party module (``torch``) is none of ours."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        parent = _module_of(node.value, aliases, root, packages)
        dotted = f"{parent}.{node.attr}" if parent else None
        return dotted if dotted and _is_our_module(root, dotted, packages) else None
    return None


def _private_from_imports(tree: ast.AST, module: str, is_package: bool,
                          packages: tuple[str, ...]) -> list[str]:
    """``from X import _name`` of one of our modules ``X``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = _imported_module(node, module, is_package)
        if source.split(".")[0] not in packages:
            continue
        found += [f"{module}: {alias.name} from {source}" for alias in node.names
                  if _is_private(alias.name)]
    return found


def _private_attributes(tree: ast.AST, module: str, is_package: bool, root: str,
                        packages: tuple[str, ...]) -> list[str]:
    """``X._name`` where ``X`` is an alias of another of our modules, one entry per use."""
    aliases = _module_aliases(tree, module, is_package, root, packages)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
            continue
        owner = _module_of(node.value, aliases, root, packages)
        if owner and owner != module:  # a module's own names are its own, by whatever path
            found.append(f"{module}: {node.attr} from {owner}")
    return found


def private_imports(root: str, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Every ``from X import _name`` and every ``X._name`` through a module alias in the modules
    of ``packages`` (directories under ``root``) where ``X`` is another module of one of
    ``packages``, as ``module: name from X``."""
    found = []
    for package in packages:
        for directory, _, files in sorted(os.walk(os.path.join(root, package))):
            for file in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(directory, file)
                module, is_package = _module_name(root, path)
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read(), path)
                found += _private_from_imports(tree, module, is_package, packages)
                found += _private_attributes(tree, module, is_package, root, packages)
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


def test_the_checker_finds_planted_attribute_uses(tmp_path):
    """Each form of a module alias (``import ... as``, a bare ``import a.b.c`` and its chain,
    ``from . import m [as x]``, ``from pkg.sub import m``, inside a function) reaching a private
    name, beside what is not a violation: ``self._x``, a private name on a function imported by
    name, third-party modules' private names, dunders, a module's own names."""
    package = tmp_path / "fakepkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "owner.py").write_text(
        "import fakepkg.owner as me\n"
        "def _secret():\n    pass\n\n\ndef public():\n    pass\n\n\nme._secret()\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "deep.py").write_text("def _hidden():\n    pass\n")
    (package / "user.py").write_text(
        "import os\n"
        "import torch\n"
        "import fakepkg.owner as own\n"
        "import fakepkg.sub.deep\n"
        "from . import owner\n"
        "from .sub import deep as d\n"
        "from fakepkg import sub\n"
        "from .owner import public\n"
        "\n\n"
        "class Thing:\n"
        "    def __init__(self):\n"
        "        self._x = public._cache = os._exit\n"  # a local object, a function, stdlib
        "        torch._C\n"                            # a third-party module
        "        owner.__doc__, owner.public\n"         # a dunder, a public name
        "\n\n"
        "def uses():\n"
        "    from .sub import deep\n"
        "    own._secret()\n"
        "    fakepkg.sub.deep._hidden()\n"
        "    fakepkg.owner._secret()\n"
        "    owner._secret = d._hidden\n"
        "    sub.deep._hidden(), deep._hidden()\n")
    assert private_imports(str(tmp_path), ("fakepkg",)) == [
        "fakepkg.user: _hidden from fakepkg.sub.deep",
        "fakepkg.user: _hidden from fakepkg.sub.deep",
        "fakepkg.user: _hidden from fakepkg.sub.deep",
        "fakepkg.user: _hidden from fakepkg.sub.deep",
        "fakepkg.user: _secret from fakepkg.owner",
        "fakepkg.user: _secret from fakepkg.owner",
        "fakepkg.user: _secret from fakepkg.owner",
    ]
