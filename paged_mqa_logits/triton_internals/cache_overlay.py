"""The run-time half of the ahead-of-time cache: make Triton find precompiled kernels.

Run-time rule (documented in the README):

* ``PAGED_MQA_LOGITS_KERNEL_CACHE`` = a path list (``os.pathsep``) of precompiled caches;
  ``off`` (or ``0``/``none``) disables them. Unset: every existing one of
  ``<package>/kernel_cache``, ``<source checkout>/kernel_cache`` (CMake's default output) and
  ``${XDG_CACHE_HOME:-~/.cache}/paged_mqa_logits/kernel_cache`` (a relative ``XDG_CACHE_HOME``
  is ignored, as the XDG spec says).
* Only caches :func:`~paged_mqa_logits.aot.precompile.precompile` wrote are used: a directory
  needs its ``manifest.json``, which lists the sha256 of every file; a file that is not listed
  or does not match is ignored (the JIT compiles instead). Only what this user (or root, for an
  installed cache) owns and nobody else can write is trusted (:func:`untrusted_reason`): a cache
  directory or manifest that fails this is not used, and a file fails it if it, or any directory
  from it up to the cache directory, does (one warning each; the JIT compiles instead). A
  missing, torn or garbage manifest disables that directory with one warning, decided once per
  process (:func:`activate`); calls then JIT-compile, they never fail.
  The manifest is written atomically (a temporary file in the same directory, then ``os.replace``).
* The caches are read-only overlays: ``PrecompiledOverlayCacheManager`` serves a lookup from
  Triton's normal cache dir first (``TRITON_CACHE_DIR`` or ``~/.triton/cache``, untouched) and
  then from the precompiled dirs; new compilations are still written to the normal dir.
  ``TRITON_CACHE_DIR`` is never changed. If the user installed their own
  ``TRITON_CACHE_MANAGER``, we leave it alone and the overlay stays off.
* Precompiled entries match only the same Triton build (wheel), the same Python ABI (for the
  launcher stubs) and the same cache-invalidating env vars (``AMDGCN_USE_BUFFER_OPS``, ...).

The backend registry activates the overlay before the first Triton-based backend loads, so this
module sits below the backends: it imports nothing of the package but
:mod:`paged_mqa_logits.triton_internals`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import sysconfig
import tempfile
import threading
from pathlib import Path

from . import compiler
from .compiler import cache_invalidating_env
from .version import installed_version

ENV_CACHE = "PAGED_MQA_LOGITS_KERNEL_CACHE"
MANIFEST = "manifest.json"
#: CU/SM count assumed for families the table does not describe (only dispatch reads it)


# ============================================================================ run-time lookup
def default_dirs() -> list[str]:
    package = Path(__file__).resolve().parent.parent
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(xdg):  # the XDG spec: a relative path is invalid and is ignored
        xdg = os.path.join(os.path.expanduser("~"), ".cache")
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

    class PrecompiledOverlayCacheManager(compiler.FileCacheManager):
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
            """``root/key/filename`` if the manifest lists it, nobody else can change it and its
            bytes match, else None."""
            relative = f"{self.key}/{filename}"
            expected = self.precompiled_files.get(root, {}).get(relative)
            path = os.path.join(root, self.key, filename)
            if expected is None or not os.path.exists(path) or not trusted_below(root, path):
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
    log = logging.getLogger("paged_mqa_logits")
    manifest_path = os.path.join(directory, MANIFEST)
    for path in (directory, manifest_path):
        reason = untrusted_reason(path) if os.path.lexists(path) else None
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


def trusted_uids() -> set[int]:
    """Owners a cache's files may have: this user, and root (a cache installed system-wide)."""
    return {os.getuid(), 0}


def untrusted_reason(path: str) -> str | None:
    """Why another user could have put or changed ``path`` (``None``: nobody but its trusted
    owner can): a symbolic link, owned by another user, or writable by group or others (with or
    without the sticky bit: a sticky directory still takes others' files)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if st.st_uid not in trusted_uids():
        return f"owned by another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


_UNTRUSTED_WARNED: set[str] = set()


def trusted_below(root: str, path: str) -> bool:
    """``path`` and every directory from it up to ``root`` pass :func:`untrusted_reason`; warns
    once per path that does not."""
    current = path
    while True:
        try:
            reason = untrusted_reason(current)
        except OSError:
            return False
        if reason is not None:
            if current not in _UNTRUSTED_WARNED:
                _UNTRUSTED_WARNED.add(current)
                logging.getLogger("paged_mqa_logits").warning(
                    "kernel cache %s: %s is %s: its kernels are not used (the JIT compiles instead)", root, current,
                    reason)
            return False
        if current == root or len(current) <= len(root):
            return True
        current = os.path.dirname(current)


_HASHES: dict[tuple, str] = {}
_MISMATCH_WARNED: set[str] = set()


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_matches(path: str, expected: str) -> bool:
    """The file's sha256 equals the manifest's (memoised per inode, size and mtime). Warns once
    per mismatching file."""
    try:
        st = os.stat(path)
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


def read_manifest_or_empty(directory: str) -> dict:
    """For :func:`precompile` adding to a directory: a damaged manifest is rebuilt, not fatal."""
    try:
        return read_manifest(directory) or {}
    except ManifestError as exc:
        logging.getLogger("paged_mqa_logits").warning("%s; writing a new one", exc)
        return {}


def restrict_to_owner(directory: str) -> None:
    """Clear the group and other write bits of ``directory`` and everything in it (files the
    compiler wrote under a permissive umask), so the run-time rule (:func:`untrusted_reason`)
    trusts what precompile wrote."""
    for root, dirs, names in os.walk(directory):
        for path in [root] + [os.path.join(root, name) for name in dirs + names]:
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))


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

