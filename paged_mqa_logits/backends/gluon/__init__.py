"""``gluon`` backend: hand-laid-out Gluon kernels, one *variant* per kernel family.

Every variant is a pair of modules named after it: the host module ``<variant>.py`` here (knobs,
resource rules, candidates, launch plan, and ``VARIANT``, an instance of a
:class:`~.variant.GluonVariant` subclass) and the device module ``kernels/<variant>.py``
(``@gluon.jit`` functions and the constexpr layouts they need). A kernel module imports no host
module; the host module imports its kernel module.

===============  ==============  ============================================================
variant          archs           kernel
===============  ==============  ============================================================
``wgmma``        sm_90           wgmma on cp.async-staged key tiles
``wgmma_ws``     sm_90           the same, copies in a producer warpgroup (mbarriers)
``wgmma_pipes``  sm_90           consumer teams, one producer warp and ring each, TMA keys
                                 and scales, ``clean_logits`` fused
``mma_v2``       sm_90           the register-MMA kernel body with ``mma_v2`` atoms; never
                                 tuned, the default where the wgmma variants decline (128
                                 heads at next_n 5-8, 256 at 3-8)
``mfma``         gfx942, gfx950  the register-MMA kernel body with MFMA atoms, buffer loads
                                 (the ``KeyLoad`` knob's costs: ``cdna_keys.py``)
``wgmma_fp4``    sm_90 (MXFP4)   e2m1 widened to e4m3 in registers (exact), then the
                                 ``wgmma`` tile scoring
===============  ==============  ============================================================

The rows are in the order of :data:`VARIANT_MODULES` (an arch's default variant is its first).

Shared by several variants: ``register_mma`` (the register-MMA kernel body ``mfma`` and
``mma_v2`` run, ``kernels/register_mma.py``, and their shared host side, ``register_mma.py``),
``kernels/device.py`` (device helpers every kernel shares), ``common.py`` (host helpers every
variant shares), ``variant.py`` (the interface and the plumbing every variant inherits).

This package aggregates the variants: the backend serves a problem when any variant does, its
candidates are the union (less those of a variant with ``tuned = False``: it stays launchable
by name and as a fallback), and ``launch`` dispatches on ``config["variant"]`` (the arch's
default variant when absent). Variant modules are imported here once, by :func:`load_variants`:
one that fails to import raises, naming the module, so a broken variant never silently
disappears (the registry then reports the whole backend unavailable and dispatch falls back).
Importing this package needs Triton, not a GPU.
"""

from __future__ import annotations

import importlib

from ...problem import LaunchArgs, Problem, Target
from ..base import CompileSpec, formats_unsupported
from .variant import GluonVariant

#: variant modules, in preference order for an arch's default variant
VARIANT_MODULES = ("wgmma", "wgmma_ws", "wgmma_pipes", "mma_v2", "mfma", "wgmma_fp4")



def load_variants(package: str, modules: tuple[str, ...]) -> list[GluonVariant]:
    """The ``VARIANT`` of each of ``package``'s ``modules``, in order. ``ImportError`` names a
    module that fails to import; ``TypeError`` one whose ``VARIANT`` is not a :class:`GluonVariant`."""
    out = []
    for name in modules:
        try:
            module = importlib.import_module(f"{package}.{name}")
        except Exception as exc:
            raise ImportError(f"gluon variant module {name!r} failed to import: {type(exc).__name__}: {exc}") from exc
        variant = getattr(module, "VARIANT", None)
        if not isinstance(variant, GluonVariant):
            raise TypeError(f"gluon variant module {name!r}: expected VARIANT to be a GluonVariant, "
                            f"got {type(variant).__name__}")
        out.append(variant)
    return out


_VARIANTS: list[GluonVariant] = load_variants(__name__, VARIANT_MODULES)


def variants() -> list[GluonVariant]:
    """The variants, in :data:`VARIANT_MODULES` order."""
    return list(_VARIANTS)


class GluonBackend:
    name = "gluon"

    @property
    def knobs(self) -> tuple[str, ...]:
        out = ["variant"]
        for variant in _VARIANTS:
            out += [k for k in variant.knob_space if k not in out]
        return tuple(out)

    def _serving(self, problem: Problem) -> list[GluonVariant]:
        return [v for v in _VARIANTS if v.unsupported(problem) is None]

    def unsupported(self, problem: Problem) -> str | None:
        if problem.arch == "cpu":  # what CPU tensors run as (arch.detect)
            return "gluon kernels run on GPU tensors only, got CPU tensors"
        # the formats some variant for the arch reads (MXFP4: sm_90's ``wgmma_fp4``); each variant
        # declines the ones it does not
        read = tuple(dict.fromkeys(f for v in _VARIANTS if problem.arch in v.archs for f in v.kv_formats)) or ("fp8",)
        formats = formats_unsupported("gluon", problem, kv_formats=read, logits_dtypes=("fp32", "bf16"))
        if formats is not None:
            return formats
        if self._serving(problem):
            return None
        reasons = [f"{v.name}: {v.unsupported(problem)}" for v in _VARIANTS]
        return "no gluon variant serves this problem (" + "; ".join(reasons) + ")"

    def unavailable(self, target: Target) -> str | None:
        if target.device_type != "cuda":  # ROCm tensors are "cuda" tensors too
            return f"gluon kernels run on GPU tensors only, got {target.device_type} tensors"
        return None

    def candidates(self, problem: Problem) -> list[dict]:
        """The serving variants' candidates, less those of a variant that declares itself
        ``tuned = False`` (it stays launchable by name and as a fallback)."""
        return [c for v in self._serving(problem) if v.tuned for c in v.candidates(problem)]

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
            variant = next((v for v in _VARIANTS if v.name == name), None)
            if variant is None:
                return (f"gluon knob variant={name!r}: expected one of "
                        f"{', '.join(v.name for v in _VARIANTS)}")
            return variant.check_config(config, problem)
        serving = self._serving(problem)[:1] if problem is not None else list(_VARIANTS)
        if not serving:
            return None
        errors = [v.check_config(config, problem) for v in serving]
        return None if None in errors else "; ".join(errors)

    def variant(self, problem: Problem, config: dict) -> GluonVariant:
        """The variant that runs ``config`` (its ``variant``, else the arch's default variant)."""
        name = config.get("variant")
        if name is None:
            serving = self._serving(problem)
            if not serving:
                raise ValueError(f"gluon: {self.unsupported(problem)}")
            return serving[0]
        for variant in _VARIANTS:
            if variant.name == name:
                return variant
        raise ValueError(f"gluon: unknown or unavailable variant {name!r} "
                         f"(available: {', '.join(v.name for v in _VARIANTS)})")

    def launch(self, args: LaunchArgs, config: dict) -> None:
        self.variant(args.problem, config).launch(args, config)

    def writes_tails(self, problem: Problem, config: dict) -> bool:
        """Whether the variant that runs ``config`` writes ``clean_logits``' ``-inf`` itself."""
        return self.variant(problem, config).cleans_logits

    def compile_specs(self, arch: str, configs: list[dict] | None = None) -> list[CompileSpec]:
        """Specs of every variant that targets ``arch``: its whole compile matrix (``configs``
        ``None``), or the given table configs (row fields merged with knobs), each built by the
        variant it names (default: the arch's first variant that reads the row's ``kv_format``)."""
        targeting = [v for v in _VARIANTS if arch in v.archs]
        if not targeting:
            raise ValueError(f"no gluon variant targets {arch}")
        if configs is None:
            return [spec for variant in targeting for spec in variant.compile_specs(arch)]
        by_variant: dict[str, list[dict]] = {}
        for config in configs:  # a row naming no variant: the arch's first that reads its format
            fmt = config.get("kv_format") or "fp8"
            default = next((v for v in targeting if fmt in v.kv_formats), targeting[0]).name
            by_variant.setdefault(config.get("variant") or default, []).append(config)
        specs: list[CompileSpec] = []
        for variant in targeting:
            chosen = by_variant.pop(variant.name, [])
            if chosen:
                specs += variant.compile_specs(arch, _distinct_kernels(chosen))
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
