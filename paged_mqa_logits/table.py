"""Tuned tables: CSV schema, loading and merging, and the lookup rules.

Schema (one header line; ``#`` lines and blank lines are ignored anywhere):

=================  ==========================================================================
column             meaning
=================  ==========================================================================
arch               ``sm_90``, ``gfx942``, ``gfx950``, ... (``cpu`` is allowed)
cu_num             CU (ROCm) / SM (CUDA) count the row was tuned on
op                 the op the row tunes: ``mqa_logits`` (the logits op) or ``topk``
                   (``paged_mqa_logits.topk``); optional, absent or empty = ``mqa_logits``
heads              H
head_dim           D (128)
kv_block_size      KVBlockSize
preshuffle         0 / 1
batch              B
next_n             next_n
kv_format          ``fp8`` / ``fp4`` (MXFP4); optional, absent or empty = ``fp8``
logits_dtype       ``fp32`` / ``bf16``; optional, absent or empty = ``fp32``
context            the context the row was tuned at, or ``any`` for a row tuned across
                   contexts (geomean) that serves calls without a ``context_hint``
backend            ``gluon``, ``flydsl``, ``triton``, ``torch``
ChunkK, WavePerEU, SplitKV   the common knobs (empty = backend default); ``WavePerEU`` may be
                   left out (AMD's knob: sm_90 tables have no such column)
rows, k           ``topk`` rows only: the rows selected from (batch x next_n) and ``k``
                   (:class:`~paged_mqa_logits.problem.TopkKey`); they share ``logits_dtype``
                   and ``context`` (the row width) with the logits rows, and leave the
                   logits-only key columns and knobs empty (and vice versa)
<other columns>    backend-specific knobs (``variant``, ``num_warps``, ...); empty = default.
                   A knob one arch's backend never varies (:data:`FIXED_KNOBS`: ``num_warps`` 4
                   of sm_90's ``gluon``) is no column of that arch's table: its rows read it as
                   set; a file that has the column (as older files do) is read as it is
us                 measured microseconds (empty for priors)
provenance         who produced the row: ``tuned:<gpu>|cu<N>|triton<v>|torch<v>|<date>`` (the
                   tuner), ``bench:<gpu>|...|<date>|<bench CSV>`` (picked by hand from a committed
                   same-run bench) or ``prior:<where it comes from>``; optionally followed by
                   ``; `` and a cycle estimate of the pick (:data:`ESTIMATE_FORMAT`)
=================  ==========================================================================

Files: the shipped ``configs/*_tuned.csv``, unless ``PAGED_MQA_LOGITS_CONFIGS`` (alias
``AITER_CONFIG_PAGED_MQA_LOGITS``) holds a path list (``os.pathsep``-separated). The list
replaces the shipped files; the entry ``default`` stands for them, so ``default:/my/t.csv``
merges a file over the shipped tables. A directory entry means its ``*_tuned.csv`` files.
A file may hold rows of both ops; tuned top-k rows are kept beside the logits tables in files of
their own (``configs/<arch>_topk_tuned.csv``, docs/TUNING.md), read by the same loader.
Merging: rows with the same key (:attr:`Row.key`: every column up to ``context``) are
de-duplicated; within a file the fastest ``us`` wins (a row without ``us`` loses to one with),
and a later file replaces an earlier file's row.

Lookup (:func:`lookup`), deterministic:

1. rows of the same arch, heads, head_dim, kv_block_size, preshuffle, next_n, kv_format and
   logits_dtype (a bf16-logits call without rows of its own takes the fp32-logits rows: the
   dtype changes only the store); rows of the device's exact ``cu_num`` if there are any, else
   those of the nearest tuned ``cu_num``;
2. with a ``context_hint`` and context-specific rows: the nearest tuned batch among them, then
   the nearest tuned context for that batch;
3. otherwise the ``any`` rows: the exact batch, else the nearest tuned batch;
4. no row: the per-arch default (:data:`DEFAULT_BACKEND`).

Top-k rows (:func:`lookup_topk`): rows of the same arch and logits dtype (bf16 calls without
rows of their own take the fp32 rows), of the exact or nearest ``cu_num``; then the nearest
tuned ``k``, the nearest tuned ``rows``, and the nearest tuned context (the call's width) among
them, else their ``any`` row; no row: ``top_k/backends.py``'s default.

"Nearest" is in log2 distance, ties going to the larger value (larger batch / context).

Estimates (:class:`CycleEstimate`, :attr:`Row.estimate`): a static estimate of the picked
kernel's cycles per 64 keys next to AITER's Gluon kernel's at its default and its best knobs
(``tools/amd_side_by_side.py``, docs/VERIFICATION.md), so an operator sees which rows to tune
first; it is information, never a measurement (``us`` stays empty) and lookup ignores it.
"""

from __future__ import annotations

import csv
import glob
import io
import math
import os
import re
import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from . import backends
from .arch import normalise_arch
from .errors import PagedMQAArgumentError, PagedMQAEnvironmentError
from .files import atomic_write, read_text
from .problem import (OPTIONAL_KEY_COLUMNS, SHAPE_KEY_COLUMNS, TOPK_KEY_COLUMNS, Problem, ShapeKey, Target, TopkKey,
                      int_cell)

ENV_CONFIGS = "PAGED_MQA_LOGITS_CONFIGS"
ENV_CONFIGS_ALIAS = "AITER_CONFIG_PAGED_MQA_LOGITS"
ANY_CONTEXT = "any"

KEY_COLUMNS = ("arch", "cu_num") + SHAPE_KEY_COLUMNS + ("context",)
#: the ops a row may tune (its ``op`` cell) and the one a file without the column tunes
OPS = ("mqa_logits", "topk")
DEFAULT_OP = "mqa_logits"
#: columns that are no knob of any row: the op and every key column of either op
NOT_KNOBS = KEY_COLUMNS + ("op",) + TOPK_KEY_COLUMNS
COMMON_KNOBS = ("ChunkK", "WavePerEU", "SplitKV")
#: common knobs a table may leave out: written only when some row sets them
OPTIONAL_KNOBS = ("WavePerEU",)
META_COLUMNS = ("backend", "us", "provenance")
#: every column of a logits table but the optional key columns (tables written before those
#: existed lack them) and the optional knobs
REQUIRED_COLUMNS = (tuple(c for c in KEY_COLUMNS if c not in OPTIONAL_KEY_COLUMNS) + ("backend",)
                    + tuple(c for c in COMMON_KNOBS if c not in OPTIONAL_KNOBS) + ("us", "provenance"))
#: the columns a file with an ``op`` column needs whatever its rows, and per op the further ones
BASE_COLUMNS = ("arch", "cu_num", "op", "context", "backend", "us", "provenance")
OP_COLUMNS = {"mqa_logits": REQUIRED_COLUMNS, "topk": TOPK_KEY_COLUMNS}
#: (arch, backend) -> knobs that backend never varies on that arch: no column of the arch's
#: table (the writer leaves them out), set in every row read from a file without the column
FIXED_KNOBS = {("sm_90", "gluon"): {"num_warps": 4}}
KNOWN_BACKENDS = backends.registry.BACKEND_NAMES


class TableError(PagedMQAArgumentError):
    """A malformed table file; the message starts with ``file:line``."""


#: how a provenance states a cycle estimate (cycles of one wave per 64 keys x next_n rows;
#: ``-`` where AITER's kernel has no compiled spill-free config for the shape)
ESTIMATE_FORMAT = ("estimate:<model> ours=<cycles> aiter-default=<cycles or -> aiter-best=<cycles or -> "
                   "cycles/64-keys bound=<pipe>")
_ESTIMATE = re.compile(r"(?:^|; )estimate:(?P<model>[\w.-]+) ours=(?P<ours>\d+) aiter-default=(?P<default>\d+|-) "
                       r"aiter-best=(?P<best>\d+|-) cycles/64-keys bound=(?P<bound>\w+)(?=;|$)")


@dataclass(frozen=True)
class CycleEstimate:
    """A provenance's cycle estimate (:data:`ESTIMATE_FORMAT`)."""

    model: str
    ours: int
    aiter_default: int | None
    aiter_best: int | None
    bound: str

    def text(self) -> str:
        def cell(v):
            return "-" if v is None else str(v)
        return (f"estimate:{self.model} ours={self.ours} aiter-default={cell(self.aiter_default)} "
                f"aiter-best={cell(self.aiter_best)} cycles/64-keys bound={self.bound}")

    @staticmethod
    def parse(provenance: str) -> "CycleEstimate | None":
        """The estimate a provenance states, ``None`` if it states none; ``ValueError`` naming
        the expected form when it mentions one it does not state in that form."""
        m = _ESTIMATE.search(provenance)
        if m is None:
            if re.search(r"(?:^|; )estimate:", provenance):
                raise ValueError(f"column provenance: an estimate must read {ESTIMATE_FORMAT!r}, got {provenance!r}")
            return None
        def number(text):
            return None if text == "-" else int(text)
        return CycleEstimate(m["model"], int(m["ours"]), number(m["default"]), number(m["best"]), m["bound"])

    @staticmethod
    def strip(provenance: str) -> str:
        """The provenance without its estimate (what remains says where the pick comes from)."""
        return _ESTIMATE.sub("", provenance).strip()


@dataclass(frozen=True)
class Row:
    """One table row: the chip it was tuned on, the shape key, the context, and what to run.
    The key fields live in :attr:`shape_key` only (``row.shape_key.heads``): a
    :class:`~paged_mqa_logits.problem.ShapeKey` for a row of the logits op, a
    :class:`~paged_mqa_logits.problem.TopkKey` for a top-k row (its :attr:`op`)."""

    arch: str
    cu_num: int
    shape_key: ShapeKey | TopkKey
    context: int | None  # None = tuned across contexts ("any")
    backend: str
    config: tuple  # sorted (knob, value) pairs, only the set ones
    us: float | None
    provenance: str
    source: str  # "path:line"

    @property
    def op(self) -> str:
        """``mqa_logits`` or ``topk``: the op of the row's key (its ``op`` column)."""
        return self.shape_key.op

    @property
    def key(self) -> tuple:
        """``(arch, cu_num, shape_key, context)``: rows with the same key are duplicates; keys of
        the two ops never are (their ``shape_key`` types differ)."""
        return (self.arch, self.cu_num, self.shape_key, self.context)

    @property
    def family(self) -> tuple:
        """The rows :func:`lookup` chooses among for a problem: same arch and shape-key family."""
        return (self.arch,) + self.shape_key.family

    @property
    def knobs(self) -> dict:
        return dict(self.config)

    @property
    def estimate(self) -> CycleEstimate | None:
        """The cycle estimate the provenance states, if any."""
        return CycleEstimate.parse(self.provenance)


# ----------------------------------------------------------------------------- files
def shipped_config_dir() -> Path:
    """``configs/`` of a source checkout, else the copy installed as package data."""
    repo = Path(__file__).resolve().parent.parent / "configs"
    if repo.is_dir():
        return repo
    return Path(__file__).resolve().parent / "configs"


def shipped_files() -> list[str]:
    return sorted(glob.glob(str(shipped_config_dir() / "*_tuned.csv")))


def configured_files() -> list[str]:
    """The table files in effect, in merge order (later files win)."""
    value = os.environ.get(ENV_CONFIGS) or os.environ.get(ENV_CONFIGS_ALIAS)
    if not value:
        return shipped_files()
    name = ENV_CONFIGS if os.environ.get(ENV_CONFIGS) else ENV_CONFIGS_ALIAS
    files: list[str] = []
    for entry in filter(None, value.split(os.pathsep)):
        if entry == "default":
            files += shipped_files()
        elif os.path.isdir(entry):
            files += sorted(glob.glob(os.path.join(entry, "*_tuned.csv")))
        elif os.path.isfile(entry):
            files.append(entry)
        else:
            raise PagedMQAEnvironmentError(f"paged_mqa_logits: environment variable {name}: expected "
                                           f"existing files or directories (or 'default'), got {entry!r}, which is "
                                           f"no file or directory")
    return files


def _parse_value(text: str):
    text = text.strip()
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def known_columns() -> tuple[str, ...] | None:
    """Every column a table may have: keys, meta, the common knobs and every backend's knobs;
    ``None`` when a backend cannot be imported here (its knob names are then unknown)."""
    from .top_k.knobs import KNOB_NAMES

    columns = list(REQUIRED_COLUMNS) + list(OPTIONAL_KEY_COLUMNS) + ["op", *TOPK_KEY_COLUMNS]
    columns += [k for k in KNOB_NAMES if k not in columns]
    for name in KNOWN_BACKENDS:
        backend = backends.get(name)
        if backend is None:
            return None
        columns += [k for k in backend.knobs if k not in columns]
    return tuple(columns)


def parse_file(path: str) -> list[Row]:
    """Rows of one CSV file; raises :class:`TableError` with ``path:line`` on malformed input:
    a missing or unknown column, a malformed cell, a non-finite or negative ``us``, a knob
    value outside its backend's space (``Backend.check_config``)."""
    rows: list[Row] = []
    header: list[str] | None = None
    text = read_text(path, TableError)
    for lineno, line in enumerate(io.StringIO(text, newline=""), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{lineno}"
        if "\0" in line:
            raise TableError(f"{where}: not a text CSV file (NUL byte)")
        cells = next(csv.reader([line]))
        if header is None:
            header = _parse_header(cells, where)
            continue
        if len(cells) != len(header):
            raise TableError(f"{where}: expected {len(header)} cells, got {len(cells)}")
        rows.append(_parse_row(dict(zip(header, (c.strip() for c in cells))), where))
    if header is None:
        raise TableError(f"{path}:1: no header line")
    return rows


def _parse_header(cells: list[str], where: str) -> list[str]:
    header = [c.strip() for c in cells]
    missing = [c for c in (BASE_COLUMNS if "op" in header else REQUIRED_COLUMNS) if c not in header]
    if missing:
        raise TableError(f"{where}: header lacks column(s) {', '.join(missing)}")
    if len(set(header)) != len(header):
        raise TableError(f"{where}: header repeats a column")
    known = known_columns()
    unknown = [c for c in header if known is not None and c not in known]
    if unknown:
        raise TableError(f"{where}: unknown column(s) {', '.join(unknown)} (column {header.index(unknown[0]) + 1}); "
                         f"known columns: {', '.join(known)}")
    return header


def _parse_row(cells: dict, where: str) -> Row:
    if not cells["arch"]:
        raise TableError(f"{where}: column arch is empty")
    op = cells.get("op") or DEFAULT_OP
    if op not in OPS:
        raise TableError(f"{where}: column op must be one of {', '.join(OPS)}, got {op!r}")
    missing = [c for c in OP_COLUMNS[op] if c not in cells]
    if missing:
        raise TableError(f"{where}: a row of op {op} needs column(s) {', '.join(missing)}, which the header lacks")
    backend_names = _backend_names(op)
    try:
        cu_num = int_cell(cells, "cu_num", minimum=0)
        shape_key = ShapeKey.parse(cells) if op == "mqa_logits" else TopkKey.parse(cells)
        context = None if cells["context"].lower() in (ANY_CONTEXT, "") else int_cell(cells, "context", minimum=0)
    except ValueError as exc:
        raise TableError(f"{where}: {exc}") from None
    if cells["backend"] not in backend_names:
        which = "" if op == DEFAULT_OP else f" (a {op} row)"
        raise TableError(f"{where}: column backend must be one of {', '.join(backend_names)}{which}, "
                         f"got {cells['backend']!r}")
    us = None
    if cells["us"]:
        try:
            us = float(cells["us"])
        except ValueError:
            raise TableError(f"{where}: column us must be a number, got {cells['us']!r}") from None
        if not math.isfinite(us) or us < 0:  # it would win every de-duplication
            raise TableError(f"{where}: column us must be a finite number >= 0, got {cells['us']!r}")
    try:
        CycleEstimate.parse(cells["provenance"])
    except ValueError as exc:
        raise TableError(f"{where}: {exc}") from None
    knobs = {}
    for col, text in cells.items():
        if col in NOT_KNOBS or col in META_COLUMNS:
            continue
        value = _parse_value(text)
        if value is not None:
            knobs[col] = value
    arch = normalise_arch(cells["arch"])
    knobs.update({k: v for k, v in FIXED_KNOBS.get((arch, cells["backend"]), {}).items() if k not in cells})
    row = Row(
        arch=arch, cu_num=cu_num, shape_key=shape_key, context=context,
        backend=cells["backend"], config=tuple(sorted(knobs.items())), us=us,
        provenance=cells["provenance"], source=where,
    )
    error = _knob_error(row)
    if error is not None:
        raise TableError(f"{where}: {error}")
    return row


def _backend_names(op: str) -> tuple[str, ...]:
    if op == "topk":
        from .top_k.knobs import SPACES

        return tuple(SPACES)
    return KNOWN_BACKENDS


def _knob_error(row: Row) -> str | None:
    """The row's backend's verdict on its knobs, for the row's own problem (``None``: fine, or
    the backend cannot be imported here, so no call can reach it)."""
    if row.op == "topk":
        from .top_k.knobs import check_config

        return check_config(row.backend, row.knobs)
    if backends.get(row.backend) is None:
        return None
    problem = Problem.of(row.shape_key, Target.described(row.arch, row.cu_num), context=row.context,
                         max_model_len=max(row.context or 0, 131072))
    return backends.check_config(row.backend, row.knobs, problem)


def merge(files: list[str]) -> dict[tuple, Row]:
    """De-duplicated rows by key: fastest within a file, later file over earlier."""
    merged: dict[tuple, Row] = {}
    for path in files:
        local: dict[tuple, Row] = {}
        for row in parse_file(path):
            old = local.get(row.key)
            if old is None or _faster(row, old):
                local[row.key] = row
        merged.update(local)
    return merged


def _faster(new: Row, old: Row) -> bool:
    if new.us is None:
        return False
    return old.us is None or new.us < old.us


# ----------------------------------------------------------------------------- lookup
@dataclass
class Match:
    row: Row | None
    rule: str  # human-readable: which rule chose it


@dataclass(frozen=True)
class _Loaded:
    """One loaded table, published whole: rows, files and the lookup index together."""

    rows: dict[tuple, Row]
    files: list[str]
    by_family: dict[tuple, list[Row]]


_LOADED: _Loaded | None = None
_LOAD_LOCK = threading.Lock()


def _load() -> _Loaded:
    """The loaded table; the first caller builds it completely (index included) under a lock,
    then publishes it with one assignment, so no thread ever looks rows up in a partial index."""
    global _LOADED
    loaded = _LOADED
    if loaded is not None:
        return loaded
    with _LOAD_LOCK:
        if _LOADED is None:
            files = configured_files()
            rows = merge(files)
            by_family: dict[tuple, list[Row]] = {}
            for row in rows.values():
                by_family.setdefault(row.family, []).append(row)
            _LOADED = _Loaded(rows, files, by_family)
        return _LOADED


def table() -> dict[tuple, Row]:
    return _load().rows


def loaded_files() -> list[str]:
    return list(_load().files)


def reset() -> None:
    global _LOADED
    with _LOAD_LOCK:
        _LOADED = None


def _log_distance(a: int, b: int) -> float:
    return abs(math.log2(max(a, 1)) - math.log2(max(b, 1)))


def _nearest(values, target: int) -> int:
    return min(set(values), key=lambda v: (_log_distance(v, target), -v))


def lookup(problem: Problem) -> Match:
    """The table row for ``problem`` and the rule that chose it (``row=None``: no row)."""
    by_family = _load().by_family
    key = problem.shape_key
    rows = by_family.get((problem.arch,) + key.family, [])
    note = ""
    if not rows and key.logits_dtype != "fp32":  # the store differs, not the work
        rows = by_family.get((problem.arch,) + replace(key, logits_dtype="fp32").family, [])
        note = ", rows of fp32 logits"
    if not rows:
        return Match(None, "no tuned row for this arch/heads/head_dim/kv_block_size/preshuffle/next_n/kv_format/"
                           "logits_dtype")
    if not any(r.cu_num == problem.cu_num for r in rows):
        tuned_cu = _nearest((r.cu_num for r in rows), problem.cu_num)
        note += f", rows of cu_num {tuned_cu} (device has {problem.cu_num})"
    else:
        tuned_cu = problem.cu_num
    rows = [r for r in rows if r.cu_num == tuned_cu]

    by_context = [r for r in rows if r.context is not None]
    if problem.context is not None and by_context:
        batch = _nearest((r.shape_key.batch for r in by_context), key.batch)
        at_batch = [r for r in by_context if r.shape_key.batch == batch]
        context = _nearest((r.context for r in at_batch), problem.context)
        row = next(r for r in at_batch if r.context == context)
        exact = batch == key.batch and context == problem.context
        rule = "exact row" if exact else f"nearest tuned row (batch {batch}, context {context})"
        return Match(row, rule + note)
    agnostic = [r for r in rows if r.context is None]
    if agnostic:
        batch = _nearest((r.shape_key.batch for r in agnostic), key.batch)
        row = next(r for r in agnostic if r.shape_key.batch == batch)
        rule = "exact row (across contexts)" if batch == key.batch else f"nearest tuned batch {batch} (across contexts)"
        return Match(row, rule + note)
    return Match(None, "only context-specific rows and no context_hint given" + note)


def lookup_topk(arch: str, cu_num: int, key: TopkKey, context: int) -> Match:
    """The top-k row for ``key`` on ``arch`` with ``cu_num`` CUs at row width ``context``, and the
    rule that chose it (``row=None``: no row); the rules are the module docstring's."""
    by_family = _load().by_family
    rows = by_family.get((arch,) + key.family, [])
    note = ""
    if not rows and key.logits_dtype != "fp32":
        rows = by_family.get((arch,) + replace(key, logits_dtype="fp32").family, [])
        note = ", rows of fp32 logits"
    if not rows:
        return Match(None, "no tuned top-k row for this arch/logits_dtype")
    tuned_cu = cu_num if any(r.cu_num == cu_num for r in rows) else _nearest((r.cu_num for r in rows), cu_num)
    if tuned_cu != cu_num:
        note += f", rows of cu_num {tuned_cu} (device has {cu_num})"
    rows = [r for r in rows if r.cu_num == tuned_cu]
    k = _nearest((r.shape_key.k for r in rows), key.k)
    rows = [r for r in rows if r.shape_key.k == k]
    n = _nearest((r.shape_key.rows for r in rows), key.rows)
    rows = [r for r in rows if r.shape_key.rows == n]
    by_context = [r for r in rows if r.context is not None]
    if by_context:
        tuned = _nearest((r.context for r in by_context), context)
        row = next(r for r in by_context if r.context == tuned)
    else:
        tuned, row = None, rows[0]
    exact = (k, n, tuned) == (key.k, key.rows, context)
    where = "across contexts" if tuned is None else f"context {tuned}"
    return Match(row, ("exact row" if exact else f"nearest tuned row (k {k}, rows {n}, {where})") + note)


class ConfiguredTables:
    """The table files in effect, as a table source (``lookup``, ``reset``): what a dispatcher
    reads by default. Tests give a dispatcher any object with the same two methods."""

    lookup = staticmethod(lookup)
    reset = staticmethod(reset)


CONFIGURED = ConfiguredTables()


def table_configs(arch: str) -> list[tuple[dict, str, dict]]:
    """Every ``(problem fields, backend, knobs)`` the table can pick for ``arch``."""
    arch = normalise_arch(arch)
    out = []
    for row in table().values():
        if row.arch != arch or row.op != "mqa_logits":
            continue
        fields = {"arch": row.arch, "cu_num": row.cu_num, **asdict(row.shape_key), "context": row.context}
        out.append((fields, row.backend, row.knobs))
    return out


def _varying_knobs(row: Row) -> dict:
    """The knobs the table's columns must hold for ``row`` to read back as it is: its knobs less
    those at their :data:`FIXED_KNOBS` value, plus (as ``None``: an empty cell) a fixed knob it
    leaves unset (read from a file without the column, the row would have it set)."""
    fixed = FIXED_KNOBS.get((row.arch, row.backend), {})
    knobs = row.knobs
    out = {k: v for k, v in knobs.items() if k not in fixed or fixed[k] != v}
    return {**out, **{k: None for k in fixed if k not in knobs}}


@dataclass
class TableWriter:
    """Column order used when writing tables (the tuner writes through this): ``arch, cu_num,
    op``, the key columns of the ``ops`` written (the logits op's, then top-k's ``rows, k``;
    ``logits_dtype`` is shared), ``context, backend``, the logits op's common knobs (when it is
    written), the other knobs, ``us, provenance``."""

    knob_columns: list[str] = field(default_factory=list)
    ops: tuple[str, ...] = (DEFAULT_OP,)

    def header(self) -> list[str]:
        logits = DEFAULT_OP in self.ops
        common = [c for c in COMMON_KNOBS if logits and (c not in OPTIONAL_KNOBS or c in self.knob_columns)]
        extra = [c for c in self.knob_columns if c not in common]
        keys = list(SHAPE_KEY_COLUMNS) if logits else []
        if "topk" in self.ops:
            keys += [c for c in TOPK_KEY_COLUMNS + ("logits_dtype",) if c not in keys]
        return ["arch", "cu_num", "op"] + keys + ["context", "backend"] + common + extra + ["us", "provenance"]

    @classmethod
    def for_rows(cls, rows) -> "TableWriter":
        """A writer whose knob columns are the union of the rows' knobs, sorted, less those each
        row holds at its arch's fixed value (:data:`FIXED_KNOBS`), for the ops of the rows (the
        logits op's columns when there are no rows)."""
        rows = list(rows)
        ops = tuple(op for op in OPS if any(r.op == op for r in rows)) or (DEFAULT_OP,)
        return cls(sorted({k for row in rows for k in _varying_knobs(row)}), ops)

    def cells(self, row: Row) -> list[str]:
        unknown = set(_varying_knobs(row)) - set(self.header())
        if unknown:
            raise ValueError(f"row {row.key} has knob(s) {', '.join(sorted(unknown))} the header lacks")
        values = {
            "arch": row.arch, "cu_num": row.cu_num, "op": row.op, **row.shape_key.cells(),
            "context": ANY_CONTEXT if row.context is None else row.context,
            "backend": row.backend, "us": "" if row.us is None else f"{row.us:.3f}", "provenance": row.provenance,
            **row.knobs,
        }
        return [self._text(values.get(col)) for col in self.header()]

    @staticmethod
    def _text(value) -> str:
        """A cell as :func:`parse_file` reads it back: ``None`` -> empty, bools -> 0/1."""
        if value is None:
            return ""
        if isinstance(value, bool):
            return str(int(value))
        return str(value)

    @staticmethod
    def sort_key(row: Row) -> tuple:
        """Rows grouped by op, arch and family, then batch (top-k: k, rows), then context (``any``
        last)."""
        key = row.shape_key
        size = (key.batch,) if row.op == DEFAULT_OP else (key.k, key.rows)
        return (row.op, row.arch, row.cu_num) + key.family + size + (row.context is None, row.context or 0)

    def write(self, path: str, rows, comments=()) -> None:
        """Write ``rows`` (sorted by :meth:`sort_key`) atomically (:func:`files.atomic_write`: a
        failure at any point leaves the previous file as it was; a symlinked ``path`` is written
        through to its target)."""
        with atomic_write(path, newline="") as f:
            for line in comments:
                f.write(f"# {line}\n")
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(self.header())
            for row in sorted(rows, key=self.sort_key):
                writer.writerow(self.cells(row))
