"""``gluon`` backend: hand-laid-out Gluon kernels, one *variant module* per kernel family.

=================  ===========  =============================================================
module             VARIANT      archs / kernel
=================  ===========  =============================================================
``cdna.py``        ``mfma``     gfx942, gfx950: register MFMA, buffer loads
``hopper_mma.py``  ``mma_v2``   sm_90: the same kernel body with ``mma_v2`` atoms
``hopper_wgmma``   ``wgmma``    sm_90: wgmma on cp.async-staged key tiles (peak speed)
``hopper_wgmma_ws`` ``wgmma_ws`` sm_90: the same, copies in a producer warpgroup (mbarriers)
=================  ===========  =============================================================

A variant module exports ``VARIANT``, ``ARCHS``, ``unsupported(problem)``,
``candidates(problem)`` (dicts carrying ``"variant"``), ``default_config(problem)``,
``check_config(config, problem=None)`` (its ``KNOB_SPACE`` and knob parser ``_knobs``),
``launch(args, config)`` and ``compile_specs(arch, configs=None)``. This package aggregates
them: the backend serves a problem when any variant does, its candidates are the union, and
``launch`` dispatches on ``config["variant"]`` (the arch's default variant when absent).
A variant may set ``TUNED = False`` to keep its candidates out of the tuner (and so out of
the tables) while staying launchable. Variant modules are imported here once; one that fails to import (a Triton without some Gluon
API, a module still being written) is simply absent and its import error is reported by
``unsupported``. Importing this package needs Triton, not a GPU.
"""

from __future__ import annotations

import importlib

from ...problem import LaunchArgs, Problem
from ..base import CompileSpec

#: variant modules, in preference order for an arch's default variant
VARIANT_MODULES = ("hopper_wgmma", "hopper_wgmma_ws", "hopper_mma", "cdna")

#: what a variant module must define
INTERFACE = ("VARIANT", "ARCHS", "unsupported", "candidates", "default_config", "check_config", "launch",
             "compile_specs")

_MODULES = []
_IMPORT_ERRORS: dict[str, str] = {}
for _name in VARIANT_MODULES:
    try:
        _module = importlib.import_module(f"{__name__}.{_name}")
    except Exception as exc:  # an unfinished or incompatible variant must not break the others
        _IMPORT_ERRORS[_name] = f"{type(exc).__name__}: {exc}"
        continue
    _missing = [attr for attr in INTERFACE if not hasattr(_module, attr)]
    if _missing:
        _IMPORT_ERRORS[_name] = f"lacks {', '.join(_missing)}"
    else:
        _MODULES.append(_module)


def variant_modules() -> list:
    """The variant modules that imported, in :data:`VARIANT_MODULES` order."""
    return list(_MODULES)


def import_errors() -> dict[str, str]:
    return dict(_IMPORT_ERRORS)


class GluonBackend:
    name = "gluon"

    @property
    def knobs(self) -> tuple[str, ...]:
        out = ["variant"]
        for module in _MODULES:
            out += [k for k in getattr(module, "KNOBS", ()) if k not in out]
        return tuple(out)

    def _serving(self, problem: Problem) -> list:
        return [m for m in _MODULES if m.unsupported(problem) is None]

    def unsupported(self, problem: Problem) -> str | None:
        if problem.device_type == "cpu" and not problem.hypothetical:
            return "gluon kernels run on GPU tensors only, got CPU tensors"
        if self._serving(problem):
            return None
        reasons = [f"{m.VARIANT}: {m.unsupported(problem)}" for m in _MODULES]
        reasons += [f"{name}: not importable ({err})" for name, err in _IMPORT_ERRORS.items()]
        return "no gluon variant serves this problem (" + "; ".join(reasons) + ")"

    def candidates(self, problem: Problem) -> list[dict]:
        """The serving variants' candidates, less those of a variant that declares itself
        ``TUNED = False`` (it stays launchable by name and as a fallback)."""
        return [c for m in self._serving(problem) if getattr(m, "TUNED", True) for c in m.candidates(problem)]

    def default_config(self, problem: Problem) -> dict:
        serving = self._serving(problem)
        if not serving:
            raise ValueError(f"gluon: {self.unsupported(problem)}")
        return serving[0].default_config(problem)

    def check_config(self, config: dict, problem: Problem | None = None) -> str | None:
        """The named variant's verdict (``variant`` absent: the variant that would run it for
        ``problem``, or any variant when no problem is given)."""
        name = config.get("variant")
        if name is not None:
            module = next((m for m in _MODULES if m.VARIANT == name), None)
            if module is None:
                return (f"gluon knob variant={name!r}: expected one of "
                        f"{', '.join(m.VARIANT for m in _MODULES) or 'none (no variant imported)'}")
            return module.check_config(config, problem)
        modules = self._serving(problem)[:1] if problem is not None else list(_MODULES)
        if not modules:
            return None if problem is not None else "gluon: no variant imported"
        errors = [m.check_config(config, problem) for m in modules]
        return None if None in errors else "; ".join(errors)

    def variant(self, problem: Problem, config: dict):
        """The module that runs ``config`` (its ``variant``, else the arch's default variant)."""
        name = config.get("variant")
        if name is None:
            serving = self._serving(problem)
            if not serving:
                raise ValueError(f"gluon: {self.unsupported(problem)}")
            return serving[0]
        for module in _MODULES:
            if module.VARIANT == name:
                return module
        raise ValueError(f"gluon: unknown or unavailable variant {name!r} "
                         f"(available: {', '.join(m.VARIANT for m in _MODULES)}; import errors: {_IMPORT_ERRORS})")

    def launch(self, args: LaunchArgs, config: dict) -> None:
        self.variant(args.problem, config).launch(args, config)

    def compile_specs(self, arch: str, configs: list[dict] | None = None) -> list[CompileSpec]:
        """Specs of every variant that targets ``arch``: its whole compile matrix (``configs``
        ``None``), or the given table configs (row fields merged with knobs), each built by the
        variant it names (default: the arch's first variant)."""
        modules = [m for m in _MODULES if arch in m.ARCHS]
        if not modules:
            raise ValueError(f"no gluon variant targets {arch} (import errors: {import_errors()})")
        if configs is None:
            return [spec for module in modules for spec in module.compile_specs(arch)]
        by_variant: dict[str, list[dict]] = {}
        for config in configs:
            by_variant.setdefault(config.get("variant") or modules[0].VARIANT, []).append(config)
        specs: list[CompileSpec] = []
        for module in modules:
            chosen = by_variant.pop(module.VARIANT, [])
            if chosen:
                specs += module.compile_specs(arch, _distinct_kernels(chosen))
        if by_variant:
            raise ValueError(f"the table names gluon variants with no module for {arch}: {', '.join(by_variant)}")
        return specs


def _distinct_kernels(configs: list[dict]) -> list[dict]:
    """Table rows that differ only in batch / context / cu_num compile to the same kernel."""
    seen, out = set(), []
    for cfg in configs:
        key = tuple(sorted((k, v) for k, v in cfg.items() if k not in ("batch", "context", "cu_num", "arch")))
        if key not in seen:
            seen.add(key)
            out.append(cfg)
    return out


BACKEND = GluonBackend()
