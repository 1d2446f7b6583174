"""The package's imports flow one way, on the map of layers that docs/ARCHITECTURE.md draws (read
from that file, not copied here): no cycle, every module-level import points to the same or a lower layer, and a package module is imported inside a function
only where there is a reason that is not a cycle (a CLI subcommand, an optional dependency, a
process that must not load torch before it forks). Read from the sources with ``ast``: no
module is imported to check it."""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("paged_mqa_logits", "tuner")

MAP = os.path.join(ROOT, "docs", "ARCHITECTURE.md")


def read_layers(text: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The layer map of docs/ARCHITECTURE.md: the first fenced block after ``## Layers``, one
    ``layer: module, module`` line per layer, lowest first."""
    section = text[text.index("## Layers"):]
    start = section.index("```") + 3
    block = section[start:section.index("```", start)]
    layers = []
    for line in block.strip().splitlines():
        name, _, modules = line.partition(":")
        layers.append((name.strip(), tuple(m.strip() for m in modules.split(",") if m.strip())))
    return tuple(layers)


#: lowest first; a module may import its own layer and the ones before it
LAYERS = read_layers(open(MAP).read())

#: module -> why it imports package modules inside functions
LATE_IMPORTS = {
    "paged_mqa_logits.__main__": "each CLI subcommand loads only what it runs",
    "paged_mqa_logits.backends.flydsl.backend": "the kernel module needs the optional flydsl package",
    "paged_mqa_logits.backends.flydsl.build": "the kernel module needs the optional flydsl package",
    "paged_mqa_logits.op": "the clean_logits tail kernel loads Triton with the first GPU call, not with the package",
    "paged_mqa_logits.table": "the top-k knob spaces: the top_k package imports the op, which imports the table",
    "tuner.__main__": "each subcommand loads only what it runs",
    "tuner.search": "the coordinator loads torch (through arch) only once it runs",
    "tuner.recheck": "the coordinator loads torch (through arch) only once it runs",
    "tuner.worker": "a worker process loads torch and the package after it starts",
}


def _modules() -> dict[str, str]:
    out = {}
    for package in PACKAGES:
        for directory, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(directory, name)
                    dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    out[dotted[: -len(".__init__")] if dotted.endswith(".__init__") else dotted] = path
    return out


def _targets(module: str, path: str, node, modules: dict) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            parts = module.split(".") if path.endswith("__init__.py") else module.split(".")[:-1]
            parts = parts[: len(parts) - node.level + 1]
            base = ".".join(parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    return [name for name in names if name.split(".")[0] in PACKAGES and name in modules]


def _imports() -> tuple[dict[str, set], list[tuple[str, str]], dict]:
    """Module-level import edges, function-level ``(module, target)`` pairs, the modules."""
    modules = _modules()
    edges, late = {m: set() for m in modules}, []
    for module, path in modules.items():
        tree = ast.parse(open(path).read(), path)
        in_functions = {id(inner) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                        for inner in ast.walk(fn)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, path, node, modules):
                    if id(node) in in_functions:
                        late.append((module, target))
                    elif target != module:
                        edges[module].add(target)
    return edges, late, modules


def _layer(module: str) -> int:
    head = module.split(".")[0] if module.startswith("tuner") else module.split(".")[1] if "." in module else "__init__"
    for index, (_, names) in enumerate(LAYERS):
        if head in names:
            return index
    raise AssertionError(f"{module} is in no layer of the map in docs/ARCHITECTURE.md: add it")


def _cycles(edges: dict[str, set]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_the_map_is_read_from_the_architecture_document():
    assert [name for name, _ in LAYERS][:2] == ["base", "validation"] and LAYERS[-1] == ("tuner", ("tuner",))
    assert read_layers("## Layers\n\n```\nlow: a, b\nhigh: c\n```\n") == (("low", ("a", "b")), ("high", ("c",)))


def test_every_module_is_on_exactly_one_line_of_the_map():
    _, _, modules = _imports()
    named = [m for _, names in LAYERS for m in names]
    assert len(named) == len(set(named)), "a module is on two lines of the map"
    tops = {m.split(".")[0] if m.startswith("tuner") else m.split(".")[1] if "." in m else "__init__" for m in modules}
    assert tops == set(named), f"not in the map: {sorted(tops - set(named))}; in the map only: {sorted(set(named) - tops)}"


def test_the_scan_sees_the_package():
    edges, _, modules = _imports()
    assert len(modules) > 60
    assert "paged_mqa_logits.dispatch" in edges["paged_mqa_logits.op"]
    assert "paged_mqa_logits.triton_internals.cache_overlay" in edges["paged_mqa_logits.backends.registry"]


def test_no_import_cycle():
    edges, _, _ = _imports()
    assert _cycles(edges) == []


def test_a_cycle_would_be_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_flow_from_higher_layers_to_lower():
    edges, _, _ = _imports()
    upward = [f"{m} ({LAYERS[_layer(m)][0]}) imports {t} ({LAYERS[_layer(t)][0]})"
              for m, targets in edges.items() for t in targets if _layer(t) > _layer(m)]
    assert not upward, "\n".join(sorted(upward))


def test_function_level_imports_have_a_reason():
    _, late, _ = _imports()
    unexplained = sorted({f"{m} imports {t} inside a function" for m, t in late if m not in LATE_IMPORTS})
    assert not unexplained, "\n".join(unexplained)


#: backend package -> its device modules (kernels and what builds them), which import no host
#: module of their backend; FlyDSL's kernel builders read the kernel's static shape (``plan``)
DEVICE_MODULES = {
    "paged_mqa_logits.backends.gluon": ("kernels",),
    "paged_mqa_logits.backends.flydsl": ("algorithm", "ir", "kernel", "plan"),
}


def _is_device(module: str) -> bool:
    return any(module.startswith(f"{package}.{name}") and module[len(package) + 1:].split(".")[0] == name
               for package, names in DEVICE_MODULES.items() for name in names)


def _host_imports_of_kernels(edges: dict[str, set], late: list[tuple[str, str]]) -> list[str]:
    """``device module imports host module`` for every import (module level or not) of a device
    module that is neither another device module nor in the lowest layer."""
    pairs = [(m, t) for m, targets in edges.items() for t in targets] + list(late)
    return sorted(f"{m} imports {t}" for m, t in pairs
                  if _is_device(m) and not _is_device(t) and _layer(t) != 0)


def test_kernel_modules_import_no_host_module():
    edges, late, modules = _imports()
    kernels = [m for m in modules if _is_device(m)]
    assert "paged_mqa_logits.backends.gluon.kernels.wgmma_pipes" in kernels
    assert "paged_mqa_logits.backends.flydsl.algorithm" in kernels
    assert not _host_imports_of_kernels(edges, late), "\n".join(_host_imports_of_kernels(edges, late))


def test_a_kernel_importing_host_code_would_be_found():
    edges = {"paged_mqa_logits.backends.gluon.kernels.mfma": {"paged_mqa_logits.backends.gluon.common",
                                                              "paged_mqa_logits.backends.gluon.kernels.device",
                                                              "paged_mqa_logits.triton_internals.gluon_api"}}
    late = [("paged_mqa_logits.backends.flydsl.kernel", "paged_mqa_logits.backends.flydsl.build")]
    assert _host_imports_of_kernels(edges, late) == [
        "paged_mqa_logits.backends.flydsl.kernel imports paged_mqa_logits.backends.flydsl.build",
        "paged_mqa_logits.backends.gluon.kernels.mfma imports paged_mqa_logits.backends.gluon.common"]


def test_every_gluon_variant_is_a_host_and_kernel_pair():
    """``backends/gluon/<variant>.py`` (the host side, with ``VARIANT``) and
    ``backends/gluon/kernels/<variant>.py`` (its device code), for every variant module."""
    gluon = os.path.join(ROOT, "paged_mqa_logits", "backends", "gluon")
    tree = ast.parse(open(os.path.join(gluon, "__init__.py")).read())
    families = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                    and getattr(node.targets[0], "id", None) == "VARIANT_MODULES")
    assert families
    missing = [f for f in families if not os.path.exists(os.path.join(gluon, "kernels", f + ".py"))
               or not os.path.exists(os.path.join(gluon, f + ".py"))]
    assert not missing, missing


#: the most lines of code a function may have, its docstring aside; kernel bodies (functions a
#: ``jit`` or ``kernel`` decorator compiles for the device) are exempt: their length is the
#: schedule of one program, split only where the compiler inlines it back
MAX_FUNCTION_LINES = 80


def _long_functions(source: str, where: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if any(word in ast.unparse(d) for d in node.decorator_list for word in ("jit", "kernel")):
            continue
        body = node.body
        if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        lines = node.end_lineno - body[0].lineno + 1
        if lines > MAX_FUNCTION_LINES:
            out.append(f"{where}:{node.lineno} {node.name}: {lines} lines")
    return out


def test_no_function_is_longer_than_80_lines_outside_kernel_bodies():
    long = [line for module, path in _modules().items() for line in _long_functions(open(path).read(), path)]
    assert not long, "\n".join(long)


def test_a_long_function_would_be_found():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    source = f'def short():\n    """doc\n    more doc"""\n{body}\n\n\ndef long():\n{body}\n    return x0\n\n\n' \
             f'@gluon.jit\ndef kernel():\n{body}\n    return x0\n'
    assert _long_functions(source, "m.py") == [f"m.py:{MAX_FUNCTION_LINES + 6} long: {MAX_FUNCTION_LINES + 1} lines"]
