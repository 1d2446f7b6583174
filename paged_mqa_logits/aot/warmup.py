"""``warmup(...)``: compile, for the current device, every kernel a problem family can dispatch to,
so that CUDA/HIP graph capture never compiles.

A *family* is what an engine fixes at start-up: heads, kv_block_size, preshuffle, max_model_len,
the query/key format and the logits dtype, and the ranges it will call with: next_n values,
batch sizes (e.g. its graph-capture sizes), context hints, 1-D and/or 2-D ``context_lens``.
Every (next_n, batch, hint, layout) is a problem key; dispatch gives its backend and knobs
(table row, nearest row or defaults), and with ``include_fallbacks`` the default knobs of the
rest of the arch's fallback chain are added.

Triton compiles one binary per *specialisation* (constexprs, plus int arguments equal to 1 or
divisible by 16, pointer alignment, ...), not per knob set. So for the Triton-based backends
the specialisations of every problem are first computed on meta tensors
(:func:`paged_mqa_logits.launches.launches_of`, no device work), and one real call on small
synthetic inputs is made only for problems that bring a specialisation not yet warmed. The
inputs are shaped like an engine's: the table is ``ceil(max_model_len / kv_block_size)`` wide
and ``out_logits`` is a row slice of one ``[rows, max_model_len]`` workspace (pass the engine's
own ``workspace`` / ``kv_cache`` to mirror it exactly). After the calls, every predicted
specialisation is looked up in the JIT's in-memory cache; :attr:`WarmupSummary.missing` lists
any that is not there (it should be empty).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from tqdm import tqdm

from .. import backends, dispatch
from ..triton_internals.device import current_device
from ..triton_internals.specialise import in_jit_cache
from . import launches
from ..triton_internals import cache_overlay as overlay
from ..arch import detect
from ..op import launch
from ..problem import HEAD_DIM, LOGITS_DTYPES, LaunchArgs, Problem, ShapeKey, Target, fp8_dtype, key_bytes, token_bytes
from ..reference import make_inputs
from ..table import table_configs
from ..validate import MAX_MODEL_LEN, PagedMQAArgumentError, build_launch_args, check_problem, max_model_len_rule

#: max_model_len used when none is given (DeepSeek-V3.2's 163840-token context)
WARMUP_DEFAULT_MAX_MODEL_LEN = 163840


@dataclass(frozen=True)
class Family:
    """The problem keys an engine will call with (see the module docstring)."""

    heads: int
    kv_block_size: int
    preshuffle: bool = False
    next_n: tuple[int, ...] = (1,)
    batch_sizes: tuple[int, ...] = tuple(range(1, 257))
    max_model_len: int = WARMUP_DEFAULT_MAX_MODEL_LEN
    context_hints: tuple = (None,)
    lens_2d: tuple[bool, ...] = (True,)
    cu_num: int | None = None  # None: the device's (warmup); precompile takes the table's
    kv_format: str = "fp8"
    logits_dtype: str = "fp32"

    @property
    def workspace_dtype(self) -> torch.dtype:
        """The dtype of the family's logits (and of a workspace that holds them)."""
        return LOGITS_DTYPES[self.logits_dtype]


@dataclass(frozen=True)
class Call:
    problem: Problem
    backend: str
    config: dict = field(hash=False, compare=False)
    kind: str = "dispatch"  # "dispatch" (what the op runs) | "fallback" (a later backend's defaults)


def enumerate_calls(family: Family, *, arch: str, cu_num: int, fp8: str | None = None, device_type: str = "cuda",
                    hypothetical: bool = False, include_fallbacks: bool = True) -> list[Call]:
    """Every (problem, backend, knobs) the family can run, sorted so calls sharing inputs are adjacent."""
    target = Target(arch, cu_num, device_type, hypothetical)
    calls = []
    for next_n in sorted(set(family.next_n)):
        for lens_2d in sorted(set(family.lens_2d)):
            for batch in sorted(set(family.batch_sizes)):
                shape_key = ShapeKey(heads=family.heads, head_dim=HEAD_DIM, kv_block_size=family.kv_block_size,
                                     preshuffle=family.preshuffle, batch=batch, next_n=next_n,
                                     kv_format=family.kv_format, logits_dtype=family.logits_dtype)
                for hint in family.context_hints:
                    problem = Problem.of(shape_key, target, context=hint, lens_2d=lens_2d, fp8=fp8,
                                         max_model_len=family.max_model_len)
                    choice = dispatch.choose(problem, target)
                    calls.append(Call(problem, choice.backend, dict(choice.config)))
                    if not include_fallbacks:
                        continue
                    for name in dispatch.fallback_chain(arch):
                        if name != choice.backend and backends.why_not(name, problem, target) is None:
                            calls.append(Call(problem, name, dict(backends.get(name).default_config(problem)), "fallback"))
    return calls


def table_families(arch: str, *, max_model_len: int = WARMUP_DEFAULT_MAX_MODEL_LEN,
                   lens_2d: tuple[bool, ...] = (True, False)) -> list[Family]:
    """One family per (heads, kv_block_size, preshuffle, kv_format, logits_dtype, cu_num) of the
    arch's table rows: its tuned next_n values, batches ``1..largest tuned batch``, and the tuned
    contexts (plus ``None``) as hints."""
    groups: dict[tuple, dict] = {}
    for fields, _backend, _knobs in table_configs(arch):
        key = (fields["heads"], fields["kv_block_size"], fields["preshuffle"], fields["kv_format"],
               fields["logits_dtype"], fields["cu_num"])
        g = groups.setdefault(key, {"next_n": set(), "batch": 1, "contexts": set()})
        g["next_n"].add(fields["next_n"])
        g["batch"] = max(g["batch"], fields["batch"])
        if fields["context"] is not None:
            g["contexts"].add(fields["context"])
    return [
        Family(heads=h, kv_block_size=kv_block_size, preshuffle=pre, next_n=tuple(sorted(g["next_n"])),
               batch_sizes=tuple(range(1, g["batch"] + 1)), max_model_len=max_model_len,
               context_hints=(None,) + tuple(sorted(g["contexts"])), lens_2d=tuple(lens_2d), cu_num=cu,
               kv_format=fmt, logits_dtype=logits)
        for (h, kv_block_size, pre, fmt, logits, cu), g in sorted(groups.items())
    ]


def warm_context(problem: Problem) -> int:
    """Tokens per synthetic sequence: two blocks (enough to cross a block boundary), cheap."""
    return max(1, min(problem.max_model_len, 2 * problem.shape_key.kv_block_size, 256))


def warm_inputs(problem: Problem, *, device, workspace: torch.Tensor, kv_cache: torch.Tensor | None = None,
                seed: int = 0, validate: bool = True) -> LaunchArgs:
    """Small inputs shaped like an engine call of ``problem``: uniform ``warm_context`` tokens,
    a block table ``ceil(max_model_len / kv_block_size)`` wide, ``out`` = ``workspace[:rows]``
    (of the problem's logits dtype).

    ``device="meta"`` gives the same shapes, strides and storage sizes with no data (this is
    what precompile specialises); otherwise tensors come from :func:`reference.make_inputs` and
    are validated like a real call (``validate=False`` keeps ``problem`` as given instead, for a
    simulated device).
    """
    device = torch.device(device)
    p = problem
    key = p.shape_key
    kv_block_size, ctx = key.kv_block_size, warm_context(p)
    blocks = math.ceil(ctx / kv_block_size)
    width = max(1, math.ceil(p.max_model_len / kv_block_size))
    dtype = fp8_dtype(p.fp8)
    fp4 = key.kv_format == "fp4"
    if workspace.dtype != LOGITS_DTYPES[key.logits_dtype]:
        raise ValueError(f"workspace must hold {key.logits_dtype} logits ({LOGITS_DTYPES[key.logits_dtype]}), "
                         f"got {workspace.dtype}")
    out = workspace[: p.rows]
    if device.type == "meta":
        row = token_bytes(HEAD_DIM, key.kv_format)
        packed = kv_block_size * row
        nblocks = max(1, key.batch * blocks)
        kv = kv_cache if kv_cache is not None else torch.empty(
            (nblocks, packed), dtype=torch.uint8, device=device).as_strided((nblocks, kv_block_size, 1, row),
                                                                            (packed, row, row, 1))
        q = torch.empty((key.batch, key.next_n, key.heads, key_bytes(HEAD_DIM, key.kv_format)),
                        dtype=torch.uint8 if fp4 else dtype, device=device)
        q_scale = torch.empty((key.batch, key.next_n, key.heads), dtype=torch.int32, device=device) if fp4 else None
        weights = torch.empty((p.rows, key.heads), dtype=torch.float32, device=device)
        lens = torch.empty((key.batch, key.next_n) if p.lens_2d else (key.batch,), dtype=torch.int32, device=device)
        table = torch.empty((key.batch, width), dtype=torch.int32, device=device)
        return LaunchArgs(q, kv, weights, out, lens, table, p.max_model_len, p, q_scale=q_scale)

    inp = make_inputs(key.batch, key.next_n, key.heads, ctx, kv_block_size=kv_block_size, preshuffle=key.preshuffle,
                      fp8_dtype=dtype, lens_2d=p.lens_2d, max_model_len=ctx, device=device, seed=seed,
                      kv_format=key.kv_format)
    table = torch.full((key.batch, width), -1, dtype=torch.int32, device=device)
    table[:, :blocks] = inp["kv_indices"][:, :blocks]
    kv = inp["kv_cache"]
    if kv_cache is not None:  # the engine's cache: reads land in its blocks, results are scratch
        kv = kv_cache
        table[:, :blocks] %= kv_cache.shape[0]
    if not validate:
        return LaunchArgs(inp["q_fp8"], kv, inp["weights"], out, inp["context_lens"], table, p.max_model_len, p,
                          q_scale=inp["q_scale"])
    args = build_launch_args(inp["q_fp8"], kv, inp["weights"], out, inp["context_lens"], table, p.max_model_len,
                             key.preshuffle, kv_block_size, p.context, inp["q_scale"])
    if args.problem != p:
        raise RuntimeError(f"warmup inputs describe {args.problem.describe()}, expected {p.describe()}")
    return args


@dataclass
class WarmupSummary:
    device: str
    arch: str
    cu_num: int
    problems: int = 0  # problem keys enumerated
    calls_run: int = 0  # real calls made
    compiled: list[dict] = field(default_factory=list)  # per (backend, knobs): kernels warmed, calls run
    kernels: int = 0  # distinct JIT specialisations now in memory (Triton-based backends)
    missing: list[str] = field(default_factory=list)  # predicted specialisations not found afterwards
    notes: list[str] = field(default_factory=list)
    precompiled_dirs: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def describe(self) -> str:
        lines = [f"warmup on {self.device} ({self.arch}, {self.cu_num} CUs/SMs): {self.problems} problem keys, "
                 f"{self.calls_run} calls, {self.kernels} kernel specialisations in {self.seconds:.2f} s"
                 + (f"; precompiled cache: {', '.join(self.precompiled_dirs)}" if self.precompiled_dirs else "")]
        for c in self.compiled:
            knobs = ", ".join(f"{k}={v}" for k, v in sorted(c["config"].items())) or "defaults"
            lines.append(f"  {c['backend']:6s} [{knobs}] ({c['kind']}): {c['kernels']} specialisation(s), {c['calls']} call(s)")
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  MISSING: {m}" for m in self.missing]
        return "\n".join(lines)


WARMUP_PREFIX = "paged_mqa_logits.warmup: "
#: the most batch sizes ``warmup(batch_sizes=N)`` expands to (one problem key each)
MAX_WARMUP_BATCH = 1 << 16


def _fail(name: str, expected: str, got) -> None:
    raise PagedMQAArgumentError(f"{WARMUP_PREFIX}argument `{name}`: expected {expected}, got {got!r}")


def _resolve_ints(name: str, value, *, as_range: bool) -> tuple[int, ...]:
    """An int (``as_range``: 1..N) or an iterable of ints, each checked, none allocated for."""
    def is_int(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if is_int(value):
        if as_range and not 1 <= value <= MAX_WARMUP_BATCH:
            _fail(name, f"an int in 1..{MAX_WARMUP_BATCH} or a list of ints", value)
        return tuple(range(1, value + 1)) if as_range else (value,)
    try:
        values = tuple(value)
    except TypeError:
        _fail(name, "an int or a list of ints", value)
    if not values or not all(is_int(v) for v in values):
        _fail(name, "an int or a non-empty list of ints", value)
    return values


def check_family(heads, kv_block_size, preshuffle, next_ns, batch_sizes, max_model_len) -> None:
    """The op's rules on a family, before anything is allocated or compiled."""
    for name, value in (("heads", heads), ("kv_block_size", kv_block_size), ("max_model_len", max_model_len)):
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(name, "an int", value)
    if not isinstance(preshuffle, bool):
        _fail("preshuffle", "a bool", preshuffle)
    if max_model_len_rule(max_model_len) is not None or max_model_len < 1:
        _fail("max_model_len", f"an int in 1..{MAX_MODEL_LEN}", max_model_len)
    names = {"heads": "`heads`", "kv_block_size": "`kv_block_size`", "next_n": "`next_n`", "batch": "`batch_sizes`"}
    for next_n in next_ns:
        for batch in batch_sizes:
            check_problem(arch=None, cu_num=None, batch=batch, next_n=next_n, heads=heads, head_dim=HEAD_DIM,
                          kv_block_size=kv_block_size, preshuffle=preshuffle, context=None, names=names,
                          prefix=WARMUP_PREFIX)


def warmup(
    heads: int,
    kv_block_size: int,
    preshuffle: bool = False,
    *,
    next_n=1,
    batch_sizes=256,
    max_model_len: int = WARMUP_DEFAULT_MAX_MODEL_LEN,
    context_hints=(None,),
    lens_2d=(True,),
    device=None,
    kv_cache: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    include_fallbacks: bool = True,
    progress: bool = True,
    seed: int = 0,
    kv_format: str = "fp8",
    logits_dtype: str = "fp32",
) -> WarmupSummary:
    """Compile (or load from the precompiled cache) every kernel this family can dispatch to.

    Args:
        heads, kv_block_size, preshuffle: fixed by the model and the cache layout.
        next_n: an int (that value) or the values to cover (1 + speculative tokens).
        batch_sizes: an int N (batches 1..N) or the batches to cover (e.g. the graph-capture sizes).
        max_model_len: the engine's value (the table width and ``out_logits`` row stride follow it).
        context_hints: the ``context_hint`` values the engine passes (``None`` = no hint);
            ``"table"`` = every tuned context of this family plus ``None``.
        lens_2d: layouts to cover: ``(True,)`` vLLM's 2-D lengths, ``(False,)`` 1-D, or both.
        device: default the current GPU, else CPU.
        kv_cache, workspace: the engine's own cache / ``[rows, >= max_model_len]`` logits
            workspace (of ``logits_dtype``), to mirror their sizes exactly (optional; never read
            as results).
        include_fallbacks: also warm the default knobs of the rest of the arch's fallback chain.
        kv_format, logits_dtype: the engine's query/key format (``"fp8"``/``"fp4"``) and logits
            dtype (``"fp32"``/``"bf16"``).

    Returns a :class:`WarmupSummary`; ``summary.missing`` is empty when every predicted kernel
    specialisation is in the JIT's cache. A family the op would refuse (or a ``max_model_len``
    past int32 positions) raises ``PagedMQAArgumentError`` naming the argument, before anything
    is allocated or compiled.
    """
    started = time.perf_counter()
    next_ns = _resolve_ints("next_n", next_n, as_range=False)
    batches = _resolve_ints("batch_sizes", batch_sizes, as_range=True)
    check_family(heads, kv_block_size, preshuffle, next_ns, batches, max_model_len)
    precompiled = overlay.activate()
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    info = detect(device)
    if context_hints == "table":
        context_hints = (None,) + tuple(sorted({f["context"] for f, _, _ in _family_rows(info.arch, heads, kv_block_size, preshuffle)
                                                if f["context"] is not None}))
    family = Family(heads=heads, kv_block_size=kv_block_size, preshuffle=preshuffle,
                    next_n=next_ns, batch_sizes=batches,
                    max_model_len=max_model_len, context_hints=tuple(context_hints), lens_2d=tuple(lens_2d),
                    kv_format=kv_format, logits_dtype=logits_dtype)
    calls = enumerate_calls(family, arch=info.arch, cu_num=info.cu_num, device_type=device.type,
                            include_fallbacks=include_fallbacks)
    summary = WarmupSummary(device=str(device), arch=info.arch, cu_num=info.cu_num,
                            problems=len({c.problem for c in calls}), precompiled_dirs=precompiled)
    rows = max(c.problem.rows for c in calls)
    if workspace is None:
        workspace = torch.empty((rows, max_model_len), dtype=family.workspace_dtype, device=device)
    if workspace.shape[0] < rows or workspace.shape[1] < max_model_len:
        raise ValueError(f"workspace must be at least [{rows}, {max_model_len}], got {tuple(workspace.shape)}")
    meta_workspace = launches.meta_mirror(workspace)
    meta_kv = None if kv_cache is None else launches.meta_mirror(kv_cache)
    target = launches.current_target() if device.type == "cuda" else None

    warmed: set[tuple] = set()  # (kernel id, jit key) predicted and run
    predicted: dict[tuple, object] = {}  # same keys -> kernel
    groups_run: set[tuple] = set()  # non-Triton backends: (backend, knobs, next_n, lens_2d)
    per_config: dict[tuple, dict] = {}
    current = None  # (inputs key, LaunchArgs) of the last real inputs built
    for call in tqdm(calls, desc="paged_mqa_logits warmup", unit="call", disable=not progress):
        p = call.problem
        config_key = (call.backend, tuple(sorted(call.config.items())), call.kind)
        entry = per_config.setdefault(config_key, {"backend": call.backend, "config": dict(call.config),
                                                   "kind": call.kind, "keys": set(), "calls": 0})
        keys = None
        if target is not None and call.backend in launches.TRITON_BACKENDS:
            meta_args = warm_inputs(p, device="meta", workspace=meta_workspace, kv_cache=meta_kv)
            try:
                recorded = launches.launches_of(call.backend, meta_args, call.config, target)
                keys = {(id(r.kernel), r.jit_key): r.kernel for r in recorded}
            except Exception as exc:  # cannot specialise on meta tensors: run it once per group instead
                note = f"{call.backend}: specialisations not predicted ({type(exc).__name__}: {exc})"
                if note not in summary.notes:
                    summary.notes.append(note)
        if keys is not None:
            entry["keys"] |= set(keys)
            predicted.update(keys)
            if set(keys) <= warmed:
                continue
            warmed |= set(keys)
        else:
            group = (config_key, p.shape_key.next_n, p.lens_2d)
            if group in groups_run:
                continue
            groups_run.add(group)
        inputs_key = (p.shape_key.batch, p.shape_key.next_n, p.lens_2d, p.context)
        if current is None or current[0] != inputs_key:
            current = (inputs_key, warm_inputs(p, device=device, workspace=workspace, kv_cache=kv_cache, seed=seed))
        args = current[1]
        if call.kind == "dispatch":
            launch(args)
        else:
            launch(args, backend=call.backend, config=call.config)
        entry["calls"] += 1
        summary.calls_run += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        summary.missing = _not_in_jit_cache(predicted)
    summary.kernels = len(predicted)
    summary.compiled = [{"backend": e["backend"], "config": e["config"], "kind": e["kind"],
                         "kernels": len(e["keys"]), "calls": e["calls"]} for e in per_config.values()]
    summary.seconds = time.perf_counter() - started
    return summary


def _family_rows(arch, heads, kv_block_size, preshuffle):
    return [r for r in table_configs(arch)
            if (r[0]["heads"], r[0]["kv_block_size"], r[0]["preshuffle"]) == (heads, kv_block_size, preshuffle)]


def _not_in_jit_cache(predicted: dict) -> list[str]:
    """Predicted (kernel, key) pairs absent from the JIT's in-memory cache of the current device."""
    device = current_device()
    missing = []
    for (_, key), kernel in predicted.items():
        if not in_jit_cache(kernel, device, key):
            missing.append(f"{kernel.fn.__qualname__}: {key[:160]}")
    return missing


__all__ = ["warmup", "WarmupSummary", "Family", "Call", "enumerate_calls", "table_families", "warm_inputs",
           "WARMUP_DEFAULT_MAX_MODEL_LEN"]
