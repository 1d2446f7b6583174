"""The base of every ``gluon`` variant: what a kernel family has in common with the others.

A variant is one kernel family of the backend, named by its ``name`` (``config["variant"]``), and
its host module ``<name>.py`` and kernel module ``kernels/<name>.py`` carry the same name:

* ``wgmma`` (sm_90): wgmma on cp.async-staged key tiles;
* ``wgmma_ws`` (sm_90): the same, key copies in a producer warpgroup;
* ``wgmma_pipes`` (sm_90): consumer teams, TMA keys and scales, ``clean_logits`` fused;
* ``mma_v2`` (sm_90): the register-MMA kernel body with ``mma_v2`` atoms (never tuned, a fallback);
* ``mfma`` (gfx942, gfx950): the register-MMA kernel body with MFMA atoms;
* ``wgmma_fp4`` (sm_90, MXFP4 caches): e2m1 widened to e4m3, then ``wgmma``'s tile scoring.

The table in ``__init__.py`` says more of each.
:class:`GluonVariant` owns the plumbing every family needs and the backend relies on:

* knob validation (:meth:`~GluonVariant.check_config`: every knob in the variant's
  ``knob_space`` with an allowed value, then the combinations judged by the variant's
  :meth:`~GluonVariant.knobs` on the problem), with errors that name the knob, what it
  expects and what it got (:meth:`~GluonVariant.require`);
* candidate enumeration: the first setting of each group the variant proposes that its
  resource rules admit;
* the launch-plan cache: grid, split count, constexprs and what the per-call parts need of
  the config (a :class:`LaunchPlan`) computed once per (problem, config), so a repeated call
  only takes what truly changes per call from its tensors (:meth:`~GluonVariant.call_parts`:
  alignment, descriptors over its buffers), builds the argument tuple and launches. Filling it
  is idempotent (two threads racing on a key compute the same plan; the dict assignment is
  atomic), so no lock is taken on the launch path;
* compile specs: a hypothetical problem per compile config, the kernel specialised as the JIT
  specialises a typical vLLM call, a unique file name.

A subclass holds only its atoms: the eight abstract methods (how an unset knob resolves, the
resource rules (:meth:`~GluonVariant.admits`), the candidate groups, the default config, the
constexprs and compile options, the launch plan, the compile matrix) and the class attributes
(name, archs, knob space, kernel). The other methods have a default a family may override.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

from ...arch import native_fp8
from ...problem import LaunchArgs, Problem
from ...triton_internals import compiler
from ...triton_internals.specialise import specialise
from ..base import CompileSpec, check_knob_space, describe_allowed, formats_unsupported
from . import common


class KnobError(ValueError):
    """A knob value (or combination) a variant cannot run, naming the knob, what it expects and
    what it got."""


class LaunchPlan(NamedTuple):
    """What a launch of one config on one problem computes once (cached per
    :meth:`GluonVariant.plan_key`); a ``(grid, num_splits, kwargs)`` tuple is one with no
    ``call_inputs``."""

    grid: tuple
    num_splits: int
    #: the kernel's constexprs and compile options (the same for every call)
    kwargs: dict
    #: what :meth:`GluonVariant.call_parts` needs of the config, resolved once (the variant's
    #: own; ``None`` when it needs nothing)
    call_inputs: object = None


class GluonVariant(ABC):
    """One kernel family of the ``gluon`` backend (see the module docstring)."""

    #: the ``variant`` knob value that selects this family
    name: str = ""
    #: archs it compiles for
    archs: tuple[str, ...] = ()
    #: allowed values per knob, in CSV spelling and order (combinations are judged by :meth:`knobs`)
    knob_space: dict = {}
    #: ``False`` keeps the family out of the tuner's candidates (and so out of the tables); it
    #: stays launchable by name and as a fallback
    tuned: bool = True
    #: the ``@gluon.jit`` kernel it launches
    kernel = None
    #: whether the kernel writes ``clean_logits``' ``-inf`` itself (``LaunchArgs.clean_logits``)
    cleans_logits: bool = False
    #: the query/key formats its kernel reads (``ShapeKey.kv_format``): a family reads one
    kv_formats: tuple[str, ...] = ("fp8",)

    def __init__(self) -> None:
        self.fp8 = {arch: native_fp8(arch) for arch in self.archs}
        self._plans: dict[tuple, LaunchPlan] = {}

    def __repr__(self) -> str:
        return f"<gluon variant {self.name}>"

    @property
    def owner(self) -> str:
        return f"gluon/{self.name}"

    # ------------------------------------------------------------------------- atoms
    @abstractmethod
    def knobs(self, problem: Problem, config: dict) -> dict:
        """Every knob of :attr:`knob_space` as this family runs ``config`` on ``problem``
        (unset ones resolved); raises :class:`KnobError` on a value or combination it cannot run."""

    @abstractmethod
    def admits(self, problem: Problem, config: dict) -> bool:
        """Whether ``config`` fits the chip's registers and shared memory for ``problem``."""

    @abstractmethod
    def candidate_groups(self, problem: Problem):
        """Groups of knob settings (without ``variant``), in preference order: each group
        contributes its first setting that :meth:`admits` accepts, if any."""

    @abstractmethod
    def default_config(self, problem: Problem) -> dict:
        """The config a problem runs when no tuned row names one (every knob set)."""

    @abstractmethod
    def constexprs(self, problem: Problem, config: dict) -> dict:
        """The kernel's constexprs for ``config`` on ``problem`` (the same for every call)."""

    @abstractmethod
    def options(self, problem: Problem, config: dict) -> dict:
        """The compile options (``num_warps``, ...) of ``config`` on ``problem``."""

    @abstractmethod
    def plan(self, args: LaunchArgs, config: dict) -> LaunchPlan | tuple[tuple, int, dict]:
        """The :class:`LaunchPlan` of a launch of ``config`` (or its ``(grid, num_splits, kernel
        keyword arguments)`` when :meth:`call_parts` needs nothing of the config)."""

    def kernel_for(self, constexprs: dict):
        """The ``@gluon.jit`` kernel a launch with these constexprs runs: :attr:`kernel`, unless
        the family has a second entry point for some of its configs."""
        return self.kernel

    @abstractmethod
    def compile_matrix(self, arch: str) -> list[dict]:
        """The compile configs (problem fields + knobs) ``compile`` builds for ``arch`` by default."""

    def shape_reason(self, problem: Problem) -> str | None:
        """Why the family cannot serve a problem the common shape rules admit (``None``: it can)."""
        return None

    def plan_key(self, args: LaunchArgs, config: dict) -> tuple:
        """What a cached launch plan depends on."""
        return args.problem, common.config_key(config)

    def call_constexprs(self, args: LaunchArgs) -> dict:
        """Constexprs taken from each call's tensors (never cached: the JIT specialises on them anyway)."""
        return {}

    def call_parts(self, args: LaunchArgs, plan: LaunchPlan) -> tuple[tuple, dict]:
        """``(runtime arguments after common.kernel_arguments', per-call constexprs)``: what a
        launch takes from each call's tensors besides the cached ``plan``. It runs on every
        launch: what the config decides belongs in ``plan.call_inputs``, not here."""
        return (), self.call_constexprs(args)

    # ------------------------------------------------------------------------- knob helpers
    def require(self, ok: bool, knob: str, value, expected: str) -> None:
        """Raise :class:`KnobError` naming ``knob``, its ``value`` and what was ``expected`` unless ``ok``."""
        if not ok:
            raise KnobError(f"{self.owner} knob {knob}={value!r}: expected {expected}")

    def require_in(self, knob: str, value, allowed) -> None:
        self.require(value in allowed, knob, value, describe_allowed(allowed))

    def schedule(self, problem: Problem, config: dict, allowed=common.SCHEDULES) -> str:
        """The ``Schedule`` knob, :func:`common.default_schedule` when unset."""
        value = config.get("Schedule")
        if value is None:
            value = common.default_schedule(problem)
        self.require_in("Schedule", value, allowed)
        return value

    # ------------------------------------------------------------------------- the backend's interface
    def unsupported(self, problem: Problem) -> str | None:
        return (formats_unsupported(self.owner, problem, self.kv_formats, tuple(common.LOGITS_DTYPES))
                or common.shape_reason(problem, self.archs, self.fp8) or self.shape_reason(problem))

    def check_config(self, config: dict, problem: Problem | None = None) -> str | None:
        """Every knob in :attr:`knob_space` with an allowed value, then :meth:`knobs` on
        ``problem`` (or on the typical problem of each arch: accepted if one accepts), which
        judges the combinations."""
        if config.get("variant") not in (None, self.name):
            return f"{self.owner} cannot run variant {config['variant']!r}"
        if problem is not None and problem.arch not in self.archs:
            return f"{self.owner} runs on {', '.join(self.archs)}, not {problem.arch}"
        error = check_knob_space(self.owner, config, self.knob_space, extra=("variant",))
        if error is not None:
            return error
        problems = [problem] if problem is not None else [common.problem_for(a, self.fp8[a], {}) for a in self.archs]
        errors = []
        for p in problems:
            try:
                self.knobs(p, config)
                return None
            except ValueError as exc:
                errors.append(str(exc))
        allowed = "; ".join(f"{k} {describe_allowed(v)}" for k, v in self.knob_space.items())
        return f"{'; '.join(errors)} (allowed: {allowed})"

    def candidates(self, problem: Problem) -> list[dict]:
        out = []
        for group in self.candidate_groups(problem):
            chosen = next((c for c in group if self.admits(problem, c)), None)
            if chosen is not None:
                out.append({"variant": self.name, **chosen})
        return out

    def launch(self, args: LaunchArgs, config: dict) -> None:
        """Launch ``config`` on ``args`` (the kernel also writes ``args.clean_logits``' ``-inf``
        when the variant :attr:`cleans_logits`)."""
        key = self.plan_key(args, config)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = LaunchPlan(*self.plan(args, config))
        extra, per_call = self.call_parts(args, plan)
        kwargs = plan.kwargs
        self.kernel_for(kwargs)[plan.grid](*common.kernel_arguments(args, plan.num_splits), *extra, **kwargs,
                                           **per_call)

    def clear_plans(self) -> None:
        """Forget the cached launch plans (after a change to what they were computed from)."""
        self._plans.clear()

    # ------------------------------------------------------------------------- compile specs
    def spec_problem(self, arch: str, cfg: dict) -> Problem:
        """The hypothetical problem a compile config describes."""
        return common.problem_for(arch, self.fp8[arch], cfg)

    def spec_arguments(self, problem: Problem, cfg: dict) -> tuple[tuple, dict, dict]:
        """``(runtime arguments, constexprs, knobs naming the code path)`` of a compile config:
        stand-ins for a typical vLLM call of ``problem``."""
        return common.typical_arguments(problem), self.constexprs(problem, cfg), {}

    def compile_spec(self, arch: str, cfg: dict) -> CompileSpec:
        """One config (problem fields + knobs) specialised as the JIT specialises a typical call."""
        problem = self.spec_problem(arch, cfg)
        runtime, consts, path = self.spec_arguments(problem, cfg)
        kernel = self.kernel_for(consts)
        backend_cls = compiler.HIPBackend if arch.startswith("gfx") else compiler.CUDABackend  # loaded when used
        signature, consts, attrs = specialise(kernel, runtime, consts, backend_cls)
        knobs = dict({"variant": self.name, **self.knobs(problem, cfg)}, **path)
        return CompileSpec(
            name=common.spec_name("gluon", self.name, arch, problem, knobs, problem.kv_32bit), backend="gluon",
            arch=arch, knobs=dict(knobs, **common.problem_fields(problem)), fn=kernel, signature=signature,
            constexprs=consts, options=self.options(problem, cfg), gluon=True, attrs=attrs,
        )

    def compile_specs(self, arch: str, configs: list[dict] | None = None) -> list[CompileSpec]:
        """One spec per config (default: :meth:`compile_matrix`)."""
        return [self.compile_spec(arch, cfg) for cfg in (configs if configs is not None else self.compile_matrix(arch))]
