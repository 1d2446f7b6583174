"""Ahead-of-time kernel cache: build, on a machine with no GPU, the Triton/Gluon binaries the
tuned table can pick, so that a fresh process finds them instead of JIT-compiling.

Design: the cache *is* Triton's own on-disk cache format, filled with exactly the entries the
run-time JIT will look up. The JIT looks a kernel up by a hash of (Triton build, kernel source,
signature, constexprs, divisibility/pointer-range attributes, options, cache-invalidating env
vars, target). We never recompute that hash ourselves: :func:`record_launches` runs the real
backend ``launch`` on meta tensors while ``JITFunction.run`` is replaced by a recorder that calls
Triton's own binder, ``_pack_args`` and ``triton.compile`` for the requested target -- the same
calls the JIT makes on a device. The C modules the driver would otherwise build with gcc on the
first call are prebuilt too: the per-signature launcher stubs of Triton 3.6 (later versions have
one generic launcher) and ``cuda_utils`` (from Triton 3.8 on only where the real ``libcuda`` is
installed: its cache key includes the libcuda directory). :func:`verify` proves a
cache on a CPU machine: it launches every kernel of the manifest through the real JIT on a
simulated device of its arch and reports what was loaded and what would have been compiled.

Run-time rule (documented in the README):

* ``PAGED_MQA_LOGITS_KERNEL_CACHE`` = a path list (``os.pathsep``) of precompiled caches;
  ``off`` (or ``0``/``none``) disables them. Unset: every existing one of
  ``<package>/kernel_cache``, ``<source checkout>/kernel_cache`` (CMake's default output) and
  ``${XDG_CACHE_HOME:-~/.cache}/paged_mqa_logits/kernel_cache``.
* Only caches :func:`precompile` wrote are used: a directory needs its ``manifest.json``, which
  lists the sha256 of every file; a file that is not listed or does not match is ignored (the
  JIT compiles instead). A directory (or manifest) writable by other users -- group/other
  writable and not owned by this user, or world-writable without the sticky bit -- is refused.
  A missing, torn or garbage manifest disables that directory with one warning, decided once
  per process (:func:`activate`); calls then JIT-compile, they never fail. The manifest is
  written atomically (a temporary file in the same directory, then ``os.replace``).
* The caches are read-only overlays: :class:`PrecompiledOverlayCacheManager` serves a lookup
  from Triton's normal cache dir first (``TRITON_CACHE_DIR`` or ``~/.triton/cache``, untouched)
  and then from the precompiled dirs; new compilations are still written to the normal dir.
  ``TRITON_CACHE_DIR`` is never changed. If the user installed their own
  ``TRITON_CACHE_MANAGER``, we leave it alone and the overlay stays off.
* Precompiled entries match only the same Triton build (wheel), the same Python ABI (for the
  launcher stubs) and the same cache-invalidating env vars (``AMDGCN_USE_BUFFER_OPS``, ...).
  Build the cache in the environment that will run it (the CMake ``precompile`` target); a
  cache whose manifest names another Triton version or Python ABI is skipped with a warning.

``python -m paged_mqa_logits.kernel_cache --arch sm_90 --arch gfx950 --out DIR`` is the CLI the
CMake target runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import stat
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .arch import USUAL_CU_NUM

ENV_CACHE = "PAGED_MQA_LOGITS_KERNEL_CACHE"
MANIFEST = "manifest.json"
#: CU/SM count assumed for families the table does not describe (only dispatch reads it)
DEFAULT_CU_NUM = USUAL_CU_NUM
#: backends whose ``launch`` goes through Triton ``JITFunction``s (recordable on meta tensors)
TRITON_BACKENDS = ("triton", "gluon")


# ============================================================================ run-time lookup
def default_dirs() -> list[str]:
    package = Path(__file__).resolve().parent
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    dirs = [str(package / "kernel_cache")]
    if (package.parent / "pyproject.toml").exists():  # a source checkout: CMake's default output
        dirs.append(str(package.parent / "kernel_cache"))
    return dirs + [os.path.join(xdg, "paged_mqa_logits", "kernel_cache")]


def cache_dirs() -> list[str]:
    """Precompiled cache directories in effect (existing ones only), in lookup order."""
    value = os.environ.get(ENV_CACHE)
    if value is not None and value.strip().lower() in ("off", "0", "none", "false"):
        return []
    candidates = [p for p in value.split(os.pathsep) if p] if value else default_dirs()
    seen, out = set(), []
    for path in candidates:
        real = os.path.realpath(path)
        if os.path.isdir(real) and real not in seen:
            seen.add(real)
            out.append(real)
    return out


def _overlay_class():
    from ._triton_compat import FileCacheManager

    class PrecompiledOverlayCacheManager(FileCacheManager):
        """Triton's file cache, plus read-only lookups in the precompiled dirs.

        Group files written at precompile time hold absolute child paths of the build machine;
        children are resolved by file name inside the same key directory, so a cache can be
        built in ``build/`` and installed anywhere.
        """

        precompiled_dirs: list[str] = []
        #: directory -> {relative path: sha256} from its manifest
        precompiled_files: dict[str, dict[str, str]] = {}

        def __init__(self, key, override=False, dump=False):
            super().__init__(key, override=override, dump=dump)
            self._overlay = not (override or dump)

        def _verified(self, root, filename):
            """``root/key/filename`` if the manifest lists it and its bytes match, else None."""
            relative = f"{self.key}/{filename}"
            expected = self.precompiled_files.get(root, {}).get(relative)
            path = os.path.join(root, self.key, filename)
            if expected is None or not os.path.exists(path):
                return None
            return path if file_matches(path, expected) else None

        def _precompiled_file(self, filename):
            for root in self.precompiled_dirs:
                path = self._verified(root, filename)
                if path is not None:
                    return path
            return None

        def get_file(self, filename):
            found = super().get_file(filename)
            if found is None and self._overlay:
                found = self._precompiled_file(filename)
            return found

        def get_group(self, filename):
            group = super().get_group(filename)
            if group or not self._overlay:
                return group
            for root in self.precompiled_dirs:
                grp = self._verified(root, f"__grp__{filename}")
                if grp is None:
                    continue
                try:
                    with open(grp) as f:
                        children = dict(json.load(f).get("child_paths") or {})
                except (OSError, ValueError, AttributeError, TypeError):  # never fail a call: JIT instead
                    continue
                resolved = {name: self._verified(root, os.path.basename(p)) for name, p in children.items()}
                if all(p is not None for p in resolved.values()):
                    return resolved
            return group

    return PrecompiledOverlayCacheManager


_ACTIVE: list[str] | None = None
_ACTIVATE_LOCK = threading.Lock()


def activate() -> list[str]:
    """Make Triton find the precompiled caches (idempotent, cheap after the first call).

    Returns the directories in use ([] when none exist, the overlay is disabled, or the user
    installed their own ``TRITON_CACHE_MANAGER``).
    """
    global _ACTIVE
    if _ACTIVE is not None:
        return _ACTIVE
    with _ACTIVATE_LOCK:
        if _ACTIVE is not None:
            return _ACTIVE
        try:
            from triton import knobs
        except ImportError:
            _ACTIVE = []
            return _ACTIVE
        files = {d: listed for d in cache_dirs() if (listed := _usable(d)) is not None}
        dirs = list(files)
        if dirs:
            current = knobs.cache.manager_class
            if current is None:
                overlay = _overlay_class()
                overlay.precompiled_dirs, overlay.precompiled_files = dirs, files
                knobs.cache.manager_class = overlay
            elif getattr(current, "precompiled_dirs", None) is not None:
                current.precompiled_dirs, current.precompiled_files = dirs, files  # already ours (a reload)
            else:
                dirs = []  # the user's own cache manager wins
        _ACTIVE = dirs
        return dirs


def _usable(directory: str) -> dict[str, str] | None:
    """The manifest's ``{relative path: sha256}`` of a cache this process may use, or ``None``
    with one warning: a directory or manifest others can write, no manifest (not written by
    :func:`precompile`), a damaged one, or one built by another Triton or Python (none of its
    entries could match). A differing cache-invalidating env var only warns (entries miss)."""
    import sysconfig

    from ._triton_compat import cache_invalidating_env, installed_version

    log = logging.getLogger("paged_mqa_logits")
    manifest_path = os.path.join(directory, MANIFEST)
    for path in (directory, manifest_path):
        reason = unsafe_reason(path) if os.path.exists(path) else None
        if reason is not None:
            log.warning("kernel cache %s: %s is %s: not used", directory, path, reason)
            return None
    try:
        manifest = read_manifest(directory)
    except ManifestError as exc:
        log.warning("kernel cache %s: %s: not used (kernels are compiled by the JIT instead)", directory, exc)
        return None
    if manifest is None:
        log.warning("kernel cache %s has no %s (only caches written by precompile are used): not used",
                    directory, MANIFEST)
        return None
    built = (manifest.get("triton_version"), manifest.get("python_ext_suffix"))
    here = (installed_version(), sysconfig.get_config_var("EXT_SUFFIX"))
    if built != here:
        log.warning("kernel cache %s was built for triton %s / %s; this process runs triton %s / %s: not used",
                    directory, *built, *here)
        return None
    if manifest.get("cache_invalidating_env", {}) != cache_invalidating_env():
        log.warning("kernel cache %s was built with Triton env %s, this process has %s: its kernels will miss",
                    directory, manifest.get("cache_invalidating_env"), cache_invalidating_env())
    return manifest["files"]


def unsafe_reason(path: str) -> str | None:
    """Why other users could change ``path`` (``None``: they cannot): writable by group or
    others and not owned by this user, or world-writable without the sticky bit."""
    st = os.stat(path)
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        return "world-writable without the sticky bit"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and st.st_uid != os.getuid():
        return "writable by other users and not owned by this user"
    return None


_HASHES: dict[tuple, str] = {}
_MISMATCH_WARNED: set[str] = set()


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_matches(path: str, expected: str) -> bool:
    """The file's sha256 equals the manifest's (memoised per inode, size and mtime); a file in
    a directory others can write never matches. Warns once per mismatching file."""
    try:
        st = os.stat(path)
        if unsafe_reason(os.path.dirname(path)) is not None:
            return False
        key = (path, st.st_ino, st.st_size, st.st_mtime_ns)
        if key not in _HASHES:
            _HASHES[key] = sha256_of(path)
    except OSError:
        return False
    if _HASHES[key] == expected:
        return True
    if path not in _MISMATCH_WARNED:
        _MISMATCH_WARNED.add(path)
        logging.getLogger("paged_mqa_logits").warning(
            "kernel cache file %s does not match its manifest's sha256: ignored (the JIT compiles instead)", path)
    return False


def deactivate() -> None:
    """Undo :func:`activate` (tests, or switching caches inside one process)."""
    global _ACTIVE
    with _ACTIVATE_LOCK:
        try:
            from triton import knobs

            if getattr(knobs.cache.manager_class, "precompiled_dirs", None) is not None:
                del knobs.cache.manager_class
        except ImportError:
            pass
        _ACTIVE = None


class ManifestError(ValueError):
    """A ``manifest.json`` that cannot be read or lacks what the package needs."""


def read_manifest(directory: str) -> dict | None:
    """The directory's manifest (``None`` if it has none); :class:`ManifestError` if damaged."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            manifest = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path} is damaged ({type(exc).__name__}: {exc})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise ManifestError(f"{path} has no valid 'files' map (path -> sha256): not written by this precompile")
    if not isinstance(manifest.get("kernels", []), list):
        raise ManifestError(f"{path} has no valid 'kernels' list")
    return manifest


def _read_manifest_or_empty(directory: str) -> dict:
    """For :func:`precompile` adding to a directory: a damaged manifest is rebuilt, not fatal."""
    try:
        return read_manifest(directory) or {}
    except ManifestError as exc:
        logging.getLogger("paged_mqa_logits").warning("%s; writing a new one", exc)
        return {}


def cache_files(directory: str) -> dict[str, str]:
    """``{relative path: sha256}`` of every cache file under ``directory`` (Triton's key
    directories): not the manifest, not temporary files of an interrupted write."""
    out = {}
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("tmp.", ".")))
        for name in sorted(names):
            if name.startswith((".", "tmp.")) or (root == directory and name == MANIFEST):
                continue
            path = os.path.join(root, name)
            out[os.path.relpath(path, directory).replace(os.sep, "/")] = sha256_of(path)
    return out


def write_manifest_atomically(directory: str, manifest: dict) -> None:
    """A temporary file in ``directory``, flushed and fsynced, then ``os.replace``: a reader
    sees the old manifest or the new one, never a torn one."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".manifest.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(directory, MANIFEST))
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# ============================================================================ targets
def gpu_target(arch: str):
    """Triton's ``GPUTarget`` for ``sm_90`` / ``gfx942`` / ``gfx950`` / ... (what the driver reports)."""
    from ._triton_compat import GPUTarget
    from .arch import normalise_arch

    arch = normalise_arch(arch)
    if arch.startswith("sm_"):
        return GPUTarget("cuda", int(arch[3:]), 32)
    if arch.startswith("gfx"):
        return GPUTarget("hip", arch, 64)
    raise ValueError(f"no Triton target for arch {arch!r} (expected sm_XX or gfxNNN)")


def arch_of_target(target) -> str:
    return f"sm_{target.arch}" if target.backend == "cuda" else str(target.arch)


def current_target():
    """The target the JIT compiles for on this process's current GPU."""
    from ._triton_compat import current_target as target

    return target()


# ============================================================================ recording launches
@dataclass
class KernelLaunch:
    """One JIT launch, specialised exactly as ``JITFunction.run`` would on ``target``."""

    kernel: object  # the JITFunction / GluonJITFunction
    target: object  # GPUTarget
    jit_key: str  # the JIT's in-memory cache key (``compute_cache_key``)
    signature: dict
    constexprs: dict
    attrs: dict
    options: object  # the backend's parsed options

    @property
    def name(self) -> str:
        return self.kernel.fn.__qualname__

    def source(self):
        from ._triton_compat import ASTSource, GluonASTSource

        source_cls = GluonASTSource if self.kernel.is_gluon() else ASTSource
        return source_cls(self.kernel, self.signature, self.constexprs, self.attrs)

    def disk_key(self) -> str:
        """The hash ``triton.compile`` files this kernel under (same env vars as now)."""
        from ._triton_compat import compile_cache_hash, make_backend

        backend = make_backend(self.target)
        return compile_cache_hash(self.source(), backend, backend.parse_options(dict(self.options.__dict__)))


_RECORD_LOCK = threading.Lock()


@contextlib.contextmanager
def record_launches(target, sink: list):
    """While active, every ``JITFunction`` launch (any thread) appends a :class:`KernelLaunch`
    to ``sink`` instead of compiling or launching. The specialisation is computed by Triton's own
    binder for ``target``, so tensors may be meta tensors and no GPU is needed."""
    from ._triton_compat import JITFunction, jit_binder, jit_specialisation, make_backend

    backend = make_backend(target)
    binders: dict[int, object] = {}

    def recording_run(self, *args, grid, warmup, **kwargs):
        binder = binders.get(id(self))
        if binder is None:
            binder = binders[id(self)] = jit_binder(self, backend)
        jit_key, options, signature, constexprs, attrs = jit_specialisation(self, backend, binder, args, kwargs)
        sink.append(KernelLaunch(self, target, jit_key, signature, constexprs, attrs, options))
        return None

    with _RECORD_LOCK:
        original = JITFunction.run
        JITFunction.run = recording_run
        try:
            yield sink
        finally:
            JITFunction.run = original


def meta_mirror(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor Triton specialises like ``t``: dtype, shape, strides, storage offset (pointer
    alignment) and storage size (AMD's 2 GB pointer-range attribute). Real allocations are at
    least 256-byte aligned, so alignment is decided by the offset alone."""
    storage = t.untyped_storage().nbytes()
    base = torch.empty(max(storage // t.element_size(), 1), dtype=t.dtype, device="meta")
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


def meta_launch_args(args):
    """:class:`LaunchArgs` over meta mirrors of ``args``' tensors (same problem key)."""
    return dataclasses.replace(
        args, q=meta_mirror(args.q), kv_cache=meta_mirror(args.kv_cache), weights=meta_mirror(args.weights),
        out=meta_mirror(args.out), context_lens=meta_mirror(args.context_lens),
        block_table=meta_mirror(args.block_table),
    )


def launches_of(backend_name: str, args, config: dict, target) -> list[KernelLaunch]:
    """The kernels ``backend.launch(args, config)`` would launch on ``target`` (args may be meta)."""
    from . import backends

    if backend_name not in TRITON_BACKENDS:
        raise ValueError(f"backend {backend_name!r} does not launch through Triton; nothing to record")
    sink: list[KernelLaunch] = []
    with record_launches(target, sink):
        backends.get(backend_name).launch(args, config)
    return sink


# ============================================================================ precompiling
@contextlib.contextmanager
def _writing_to(out_dir: str):
    """Point Triton's cache writes at ``out_dir`` (plain file manager) for the duration.
    (Setting a knob also sets its env var; ``scope()`` restores both.)"""
    from triton import knobs

    with knobs.cache.scope():
        knobs.cache.dir = out_dir
        knobs.cache.manager_class = None
        yield


def compile_launch(launch: KernelLaunch, out_dir: str):
    """``triton.compile`` exactly as ``JITFunction._do_compile`` would, filed in ``out_dir``."""
    import triton

    with _writing_to(out_dir):
        return triton.compile(launch.source(), target=launch.target, options=launch.options.__dict__)


_STUB_LIBCUDA: str | None = None


def _libcuda_dir() -> str:
    """Where the launcher link finds ``libcuda.so.1``: the real one when installed, else an
    empty stub (the stub is only a link-time placeholder; the real driver resolves the symbols
    when the stub-linked launcher is loaded on a GPU machine)."""
    global _STUB_LIBCUDA
    from ._triton_compat import build_shared_library, libcuda_dirs

    try:
        return libcuda_dirs()[0]
    except Exception:
        pass
    if _STUB_LIBCUDA is None:
        stub = tempfile.mkdtemp(prefix="paged_mqa_libcuda_stub_")
        src = os.path.join(stub, "stub.c")
        Path(src).write_text("/* link-time placeholder for libcuda.so.1 */\n")
        built = build_shared_library("libcuda_stub", src, stub)
        os.replace(built, os.path.join(stub, "libcuda.so.1"))
        _STUB_LIBCUDA = stub
    return _STUB_LIBCUDA


def build_launcher(compiled, out_dir: str) -> bool:
    """Prebuild, into ``out_dir``, the C launcher stub the driver builds on a kernel's first
    launch (Triton 3.6 builds one per kernel signature; later versions have none). Returns
    whether a new one was built.

    The HIP stub embeds the path of the HIP runtime it will dlopen, so it can only be prebuilt
    where that runtime is installed (the AMD machine or image itself); elsewhere this raises.
    """
    from ._triton_compat import prebuild_launcher

    with _writing_to(out_dir):
        return prebuild_launcher(compiled, _libcuda_dir() if compiled.metadata.target.backend == "cuda" else "")


def build_driver_utils(target, out_dir: str) -> bool:
    """Prebuild ``cuda_utils`` (built once per machine on the first Triton use) into ``out_dir``.
    ROCm's ``hip_utils`` embeds the path of the local HIP runtime, so it is left to the machine."""
    from ._triton_compat import prebuild_driver_utils

    if target.backend != "cuda":
        return False
    libcuda = _libcuda_dir()
    with _writing_to(out_dir):
        return prebuild_driver_utils(target, libcuda, libcuda != _STUB_LIBCUDA)


@dataclass
class PrecompileSummary:
    out_dir: str
    targets: list[str]
    problems: int = 0  # problem keys enumerated
    kernels: list[dict] = field(default_factory=list)  # one per distinct compiled kernel
    launchers: int = 0  # launcher stubs built (new)
    skipped: list[str] = field(default_factory=list)  # (backend, why) that have nothing to precompile
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def describe(self) -> str:
        lines = [f"precompiled {len(self.kernels)} kernel(s) for {', '.join(self.targets)} "
                 f"({self.problems} problem keys, {self.launchers} launcher stub(s)) into {self.out_dir} "
                 f"in {self.seconds:.1f} s"]
        for k in self.kernels:
            knobs = ", ".join(f"{a}={b}" for a, b in sorted(k["config"].items())) or "defaults"
            lines.append(f"  {k['arch']:7s} {k['backend']:6s} {k['kernel']} [{knobs}] disk_key={k['disk_key'][:12]} "
                         f"({k['compile_s']:.1f} s)")
        lines += [f"  skipped: {s}" for s in self.skipped]
        lines += [f"  ERROR: {e}" for e in self.errors]
        return "\n".join(lines)


def precompile(
    archs,
    out_dir: str,
    *,
    families=None,
    max_model_len: int | None = None,
    batch_sizes=None,
    lens_2d=(True, False),
    include_fallbacks: bool = True,
    launchers: bool = True,
    progress: bool = True,
    only: dict | None = None,
    extra_families=None,
) -> PrecompileSummary:
    """Compile, for each arch, every kernel the tuned table (plus defaults and, optionally, the
    fallback chain's defaults) can launch for the table's problem families, specialised exactly
    like :func:`paged_mqa_logits.warmup` will launch them, into the Triton cache ``out_dir``.

    ``families``: explicit :class:`~paged_mqa_logits.warmup.Family` list (default: one per
    (heads, kv_block_size, preshuffle, next_n, cu_num) found in the table for the arch, with
    batches ``1..max tuned batch``, the tuned contexts plus ``None`` as hints, ``lens_2d`` and
    ``max_model_len``; both override the family defaults when given). ``only`` restricts the
    table's families: ``{"heads": {64}, "next_n": {1, 2}, "kv_block_size": {64}, "preshuffle": {False}}``.
    ``extra_families`` are added for every arch whether or not the table has rows for them (a
    family with no rows precompiles the arch's default choices); ``cu_num=None`` takes
    :data:`DEFAULT_CU_NUM`.
    """
    from tqdm import tqdm

    from . import dispatch
    from .warmup import WARMUP_DEFAULT_MAX_MODEL_LEN, enumerate_calls, table_families, warm_inputs

    started = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    dispatch.reset()
    targets = [gpu_target(a) for a in archs]
    summary = PrecompileSummary(out_dir=os.path.abspath(out_dir), targets=[arch_of_target(t) for t in targets])
    manifest = _read_manifest_or_empty(out_dir)
    todo: list[tuple[KernelLaunch, object, int]] = []  # (launch, first call launching it, workspace rows)
    seen_keys: set[tuple] = set()
    for target in targets:
        arch = arch_of_target(target)
        fams = families if families is not None else table_families(
            arch, max_model_len=max_model_len or WARMUP_DEFAULT_MAX_MODEL_LEN, lens_2d=tuple(lens_2d))
        if families is None and batch_sizes is not None:
            fams = [dataclasses.replace(f, batch_sizes=tuple(batch_sizes)) for f in fams]
        if families is not None and max_model_len is not None:
            fams = [dataclasses.replace(f, max_model_len=max_model_len) for f in fams]
        fams = _select(fams, only or {})
        fams += [dataclasses.replace(f, cu_num=f.cu_num or DEFAULT_CU_NUM.get(arch, 0)) for f in extra_families or []]
        if not fams:
            summary.skipped.append(f"{arch}: no tuned rows match; name a family (heads, kv_block_size, preshuffle, "
                                   f"next_n) to precompile the defaults")
        # per family, like warmup(): one [largest rows, max_model_len] logits workspace
        calls = []
        for fam in fams:
            fam_calls = enumerate_calls(fam, arch=arch, cu_num=fam.cu_num or 0, hypothetical=True,
                                        include_fallbacks=include_fallbacks)
            rows = max((c.problem.rows for c in fam_calls), default=1)
            workspace = torch.empty((rows, fam.max_model_len), dtype=torch.float32, device="meta")
            calls += [(c, workspace) for c in fam_calls]
        summary.problems += len({c.problem for c, _ in calls})
        bar = tqdm(calls, desc=f"specialise {arch}", unit="call", disable=not progress, leave=False)
        for call, workspace in bar:
            if call.backend not in TRITON_BACKENDS:
                note = f"{call.backend} on {arch}: no Triton kernels (nothing to precompile)"
                if note not in summary.skipped:
                    summary.skipped.append(note)
                continue
            args = warm_inputs(call.problem, device="meta", workspace=workspace)
            try:
                recorded = launches_of(call.backend, args, call.config, target)
            except Exception as exc:  # a backend that cannot be specialised on meta tensors
                summary.errors.append(f"{arch} {call.backend} {call.config}: {type(exc).__name__}: {exc}")
                continue
            for launch in recorded:
                ident = (arch, id(launch.kernel), launch.jit_key)
                if ident not in seen_keys:
                    seen_keys.add(ident)
                    todo.append((launch, call, workspace.shape[0]))
    for launch, call, workspace_rows in tqdm(todo, desc="compile", unit="kernel", disable=not progress):
        arch, backend_name, config = arch_of_target(launch.target), call.backend, call.config
        t0 = time.perf_counter()
        try:
            compiled = compile_launch(launch, out_dir)
        except Exception as exc:
            summary.errors.append(f"{arch} {backend_name} {launch.name} {config}: {type(exc).__name__}: {exc}")
            continue
        if launchers:
            try:
                summary.launchers += int(build_launcher(compiled, out_dir))
            except Exception as exc:  # e.g. HIP stubs embed the local HIP runtime's path
                note = f"launcher stubs for {arch}: not prebuilt, built on first launch ({type(exc).__name__}: {exc})"
                if note not in summary.skipped:
                    summary.skipped.append(note)
        summary.kernels.append({
            "arch": arch, "backend": backend_name, "kernel": launch.name, "config": dict(config),
            "kind": call.kind, "jit_key": launch.jit_key, "disk_key": compiled.hash,
            "compile_s": time.perf_counter() - t0, "problem": dataclasses.asdict(call.problem),
            "workspace_rows": workspace_rows,
        })
    if launchers:
        for target in targets:
            try:
                summary.launchers += int(build_driver_utils(target, out_dir))
            except Exception as exc:  # only a first-use speed-up: Triton builds it itself if absent
                summary.skipped.append(f"cuda_utils for {arch_of_target(target)}: not prebuilt ({type(exc).__name__}: {exc})")
    summary.seconds = time.perf_counter() - started
    _write_manifest(out_dir, manifest, summary)
    return summary


def _select(families, only: dict):
    out = []
    for fam in families:
        if any(k in only and getattr(fam, k) not in only[k] for k in ("heads", "kv_block_size", "preshuffle")):
            continue
        next_n = tuple(n for n in fam.next_n if "next_n" not in only or n in only["next_n"])
        if next_n:
            out.append(dataclasses.replace(fam, next_n=next_n))
    return out


def _write_manifest(out_dir: str, manifest: dict, summary: PrecompileSummary) -> None:
    import sysconfig

    from ._triton_compat import cache_invalidating_env, installed_version
    from .table import loaded_files

    entries = {(k["arch"], k["disk_key"]): k for k in manifest.get("kernels", [])}
    entries.update({(k["arch"], k["disk_key"]): k for k in summary.kernels})
    manifest.update({
        "triton_version": installed_version(),
        "python_ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "cache_invalidating_env": cache_invalidating_env(),
        "tables": loaded_files(),
        "targets": sorted(set(manifest.get("targets", [])) | set(summary.targets)),
        "kernels": sorted(entries.values(), key=lambda k: (k["arch"], k["backend"], k["kernel"], k["disk_key"])),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": cache_files(out_dir),
    })
    write_manifest_atomically(out_dir, manifest)


# ============================================================================ verifying
@dataclass
class VerifyResult:
    """What the real JIT did when launching each manifest kernel on a simulated device."""

    kernels: int = 0
    disk_hits: int = 0  # kernels the JIT loaded from the cache
    compiled: list[str] = field(default_factory=list)  # kernels the JIT had to compile (misses)
    launchers_found: int = 0
    launchers_built: list[str] = field(default_factory=list)  # launcher stubs it would have built
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.compiled and not self.errors and self.disk_hits == self.kernels

    def describe(self) -> str:
        text = (f"verify: {self.disk_hits}/{self.kernels} kernels found by the JIT in the cache, "
                f"{len(self.compiled)} compiled, {self.launchers_found} launcher stub(s) found, "
                f"{len(self.launchers_built)} would be built -> {'OK' if self.ok else 'FAIL'}")
        return "\n".join([text] + [f"  compiled: {c}" for c in self.compiled]
                         + [f"  launcher built: {c}" for c in self.launchers_built] + [f"  ERROR: {e}" for e in self.errors])


class _SimulatedDriver:
    """Just enough of a Triton GPU driver for ``JITFunction.run`` to go through its whole path
    (specialise, look up the caches, load, build the launcher, launch) without a GPU."""

    def __init__(self, target, launcher_cls, on_launch):
        self.target = target
        self.launcher_cls = launcher_cls
        self.utils = type("Utils", (), {})()
        # no module handle: a CompiledKernel collected after the real driver is back must not
        # ask that driver (there may be none) to unload it
        self.utils.load_binary = lambda name, binary, shared, device: (None, 1, 0, 0, 1024)
        self.utils.get_device_properties = lambda device: {"max_shared_mem": 1 << 30, "multiprocessor_count": 1}
        self.on_launch = on_launch

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


@contextlib.contextmanager
def simulated_device(target, result: VerifyResult):
    """Run Triton launches as on a ``target`` GPU: cache lookups are real, binaries are not
    loaded and nothing executes. Per-kernel CUDA launcher stubs (Triton 3.6) are looked up for
    real and their builds are refused and recorded instead."""
    from ._triton_compat import cuda_launcher_class, per_kernel_launchers, simulated_driver

    class _Stub:
        @staticmethod
        def launch(*args, **kwargs):
            return None

    def load_module(name, path):
        result.launchers_found += 1
        return _Stub

    def refuse_build(name, src, srcdir, *a, **k):
        result.launchers_built.append(name)
        raise _LauncherMiss(name)

    if target.backend == "cuda" and per_kernel_launchers():
        launcher_cls, libcuda = cuda_launcher_class(), _libcuda_dir()
    else:
        # HIP stubs need the local HIP runtime (see build_launcher); from Triton 3.7 on the
        # generic launcher lives in the driver utils this stand-in replaces
        launcher_cls, libcuda = _RecordingLauncher, None
    with simulated_driver(_SimulatedDriver(target, launcher_cls, None), on_module_load=load_module,
                          on_module_build=refuse_build, libcuda_dir=libcuda):
        yield


class _LauncherMiss(RuntimeError):
    pass


class _RecordingLauncher:
    def __init__(self, src, metadata):
        pass

    def __call__(self, *args, **kwargs):
        return None


def verify(directory: str | None = None, *, archs=None) -> VerifyResult:
    """Launch every kernel listed in a cache's manifest through the real Triton JIT on a
    simulated device of its arch, with Triton's own cache dir empty and the precompiled cache as
    the only overlay, and report what was found and what would have been compiled or built."""
    from triton import knobs

    from . import backends
    from .problem import Problem
    from .warmup import warm_inputs

    result = VerifyResult()
    dirs = [os.path.realpath(directory)] if directory else cache_dirs()
    try:
        manifest = read_manifest(dirs[0]) if dirs else None
    except ManifestError as exc:
        result.errors.append(str(exc))
        return result
    if not manifest:
        result.errors.append(f"no manifest in {dirs or 'any kernel cache dir'}")
        return result
    entries = [k for k in manifest["kernels"] if archs is None or k["arch"] in archs]

    def listener(src, metadata, metadata_group, times, cache_hit):
        if cache_hit:
            result.disk_hits += 1
        else:
            result.compiled.append(f"{metadata['name']} for {metadata['target']}")

    saved_caches = {}
    with tempfile.TemporaryDirectory() as empty, knobs.cache.scope(), knobs.compilation.scope():
        deactivate()
        saved_env = os.environ.get(ENV_CACHE)
        os.environ[ENV_CACHE] = os.pathsep.join(dirs)
        knobs.cache.dir = empty
        knobs.compilation.listener = listener
        try:
            activate()
            for entry in entries:
                problem = Problem(**entry["problem"])
                target = gpu_target(entry["arch"])
                rows = entry.get("workspace_rows", problem.rows)  # untouched memory: only its size matters
                workspace = torch.empty((rows, problem.max_model_len), dtype=torch.float32)
                args = warm_inputs(problem, device="cpu", workspace=workspace, validate=False)
                backend = backends.get(entry["backend"])
                result.kernels += 1
                # the JIT functions this launch uses start with an empty in-memory cache
                for launch in launches_of(entry["backend"], meta_launch_args(args), entry["config"], target):
                    kernel = launch.kernel
                    saved_caches.setdefault(id(kernel), (kernel, dict(kernel.device_caches)))
                    kernel.device_caches.clear()
                with simulated_device(target, result):
                    try:
                        backend.launch(args, entry["config"])
                    except _LauncherMiss:
                        pass
                    except Exception as exc:
                        result.errors.append(f"{entry['arch']} {entry['backend']} {entry['kernel']}: {type(exc).__name__}: {exc}")
        finally:
            for kernel, caches in saved_caches.values():
                kernel.device_caches.clear()
                kernel.device_caches.update(caches)
            if saved_env is None:
                os.environ.pop(ENV_CACHE, None)
            else:
                os.environ[ENV_CACHE] = saved_env
            deactivate()
    # A kernel entry may launch more than one JIT function; count hits per entry at most once.
    result.disk_hits = min(result.disk_hits, result.kernels)
    return result


# ============================================================================ CLI
def main(argv: list[str] | None = None) -> int:
    from .cli import ArgumentParser, int_list

    p = ArgumentParser(
        prog="python -m paged_mqa_logits.kernel_cache",
        description="Precompile the kernels the tuned table can pick into a Triton cache directory "
                    "the package finds at run time (no GPU needed).")
    p.add_argument("--arch", action="append", required=True,
                   help="target (repeatable or ';'-separated): sm_90, gfx942, gfx950, ...")
    p.add_argument("--out", required=True, help="cache directory to fill")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="the engine's max_model_len (default: warmup's default); kernels may specialise on it")
    p.add_argument("--batch-sizes", type=int_list, default=None,
                   help="comma-separated batch sizes (default: 1..largest tuned batch of each family)")
    p.add_argument("--lens", choices=("2d", "1d", "both"), default="both", help="context_lens layouts to cover")
    p.add_argument("--no-fallbacks", action="store_true", help="skip the fallback chain's default knobs")
    p.add_argument("--heads", type=int_list, default=None, help="only these heads (comma-separated)")
    p.add_argument("--next-n", type=int_list, default=None, help="only these next_n values (comma-separated)")
    p.add_argument("--kv-block-size", type=int_list, default=None, help="only these block sizes (comma-separated)")
    p.add_argument("--preshuffle", choices=("0", "1"), default=None, help="only this preshuffle setting")
    p.add_argument("--family", action="store_true",
                   help="with all four of --heads/--next-n/--kv-block-size/--preshuffle: also precompile that "
                        "family when the table has no rows for it (the arch's default choices)")
    p.add_argument("--no-launchers", action="store_true", help="skip the C launcher stubs")
    p.add_argument("--verify", action="store_true",
                   help="afterwards, launch every kernel through the real JIT on a simulated device and "
                        "fail if any would compile")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    archs = [x for entry in a.arch for x in entry.replace(",", ";").split(";") if x.strip()]
    batches = a.batch_sizes
    lens = {"2d": (True,), "1d": (False,), "both": (True, False)}[a.lens]
    only = {k: set(v) for k, v in (("heads", a.heads), ("next_n", a.next_n), ("kv_block_size", a.kv_block_size)) if v}
    if a.preshuffle is not None:
        only["preshuffle"] = {a.preshuffle == "1"}
    extra = []
    if a.family:
        if not (a.heads and a.next_n and a.kv_block_size and a.preshuffle is not None):
            p.error("--family needs --heads, --next-n, --kv-block-size and --preshuffle")
        from .warmup import WARMUP_DEFAULT_MAX_MODEL_LEN, Family

        extra = [Family(heads=h, kv_block_size=bs, preshuffle=a.preshuffle == "1", next_n=tuple(sorted(only["next_n"])),
                        batch_sizes=tuple(batches or range(1, 257)),
                        max_model_len=a.max_model_len or WARMUP_DEFAULT_MAX_MODEL_LEN, lens_2d=lens)
                 for h in sorted(only["heads"]) for bs in sorted(only["kv_block_size"])]
    summary = precompile(archs, a.out, max_model_len=a.max_model_len, batch_sizes=batches, lens_2d=lens,
                         include_fallbacks=not a.no_fallbacks, launchers=not a.no_launchers, progress=not a.quiet,
                         only=only, extra_families=extra)
    print(summary.describe())
    if summary.errors:
        return 1
    if a.verify:
        result = verify(a.out)
        print(result.describe())
        return 0 if result.ok else 1
    return 0


if __name__ == "__main__":
    from .cli import run

    sys.exit(run("python -m paged_mqa_logits.kernel_cache", main, sys.argv[1:]))
