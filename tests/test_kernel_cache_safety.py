"""The kernel cache only serves what precompile wrote: files listed with a matching sha256 in
an atomically written manifest, in directories other users cannot write; anything else
degrades to the JIT with one warning, decided once."""

import json
import logging
import os
import threading

import pytest

from paged_mqa_logits.triton_internals import cache_overlay as overlay
from test_kernel_cache import valid_manifest

KEY = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567ABCDEFGHIJKLMNOPQRST"


@pytest.fixture
def clean_activation(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "user_cache"))
    overlay.deactivate()
    yield
    overlay.deactivate()


def make_cache(root, content=b"\x7fELF kernel bytes", listed=True):
    os.makedirs(root / KEY, exist_ok=True)
    (root / KEY / "kernel.cubin").write_bytes(content)
    (root / KEY / "planted.so").write_bytes(b"not listed")
    files = {f"{KEY}/kernel.cubin": overlay.sha256_of(str(root / KEY / "kernel.cubin"))} if listed else {}
    overlay.write_manifest_atomically(str(root), valid_manifest(files))
    return root


def warnings_of(caplog):
    return [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "paged_mqa_logits"]


@pytest.mark.parametrize("damage", ["torn", "garbage", "binary", "no files map", "missing"])
def test_damaged_manifest_degrades_to_the_jit_with_one_warning(tmp_path, monkeypatch, clean_activation, caplog, damage):
    root = make_cache(tmp_path / "cache")
    manifest = root / overlay.MANIFEST
    text = manifest.read_text()
    if damage == "torn":
        manifest.write_text(text[: len(text) // 2])
    elif damage == "garbage":
        manifest.write_text("[1, 2")
    elif damage == "binary":
        manifest.write_bytes(b"\xff\xfe\x00garbage")
    elif damage == "no files map":
        manifest.write_text(json.dumps({k: v for k, v in json.loads(text).items() if k != "files"}))
    else:
        manifest.unlink()
    monkeypatch.setenv(overlay.ENV_CACHE, str(root))
    with caplog.at_level(logging.WARNING, logger="paged_mqa_logits"):
        assert overlay.activate() == []
        assert overlay.activate() == []  # decided once: not re-parsed
    assert len(warnings_of(caplog)) == 1 and "not used" in warnings_of(caplog)[0].getMessage()


def other_users_own_everything(monkeypatch):
    """As if the files belonged to another user: neither this user nor root is a trusted owner."""
    monkeypatch.setattr(overlay, "trusted_uids", lambda: {os.getuid() + 1} - {0})


@pytest.mark.parametrize("mode,owned,refused", [(0o777, True, True), (0o1777, True, True), (0o775, True, True),
                                                (0o755, False, True), (0o755, True, False), (0o700, True, False)])
def test_directories_others_can_write_or_own_are_refused(tmp_path, monkeypatch, clean_activation, caplog, mode, owned,
                                                          refused):
    root = make_cache(tmp_path / "cache")
    os.chmod(root, mode)
    if not owned:
        other_users_own_everything(monkeypatch)
    monkeypatch.setenv(overlay.ENV_CACHE, str(root))
    with caplog.at_level(logging.WARNING, logger="paged_mqa_logits"):
        assert overlay.activate() == ([] if refused else [str(root)])
    assert any("not used" in r.getMessage() for r in warnings_of(caplog)) == refused


@pytest.mark.parametrize("what", ["key directory group-writable", "file group-writable", "file a symlink",
                                  "key directory sticky and world-writable"])
def test_a_file_others_could_have_planted_is_not_served(tmp_path, monkeypatch, clean_activation, caplog, what):
    """Every directory from a served file up to the cache root, and the file, must be the user's
    alone: otherwise the JIT compiles instead, with one warning."""
    root = make_cache(tmp_path / "cache")
    kernel = root / KEY / "kernel.cubin"
    if what == "key directory group-writable":
        os.chmod(root / KEY, 0o775)
    elif what == "file group-writable":
        os.chmod(kernel, 0o664)
    elif what == "file a symlink":
        real = tmp_path / "elsewhere.cubin"
        real.write_bytes(kernel.read_bytes())
        kernel.unlink()
        kernel.symlink_to(real)
    else:
        os.chmod(root / KEY, 0o1777)
    monkeypatch.setenv(overlay.ENV_CACHE, str(root))
    assert overlay.activate() == [str(root)]
    from triton import knobs

    manager = knobs.cache.manager_class(KEY)
    with caplog.at_level(logging.WARNING, logger="paged_mqa_logits"):
        assert manager.get_file("kernel.cubin") is None
        assert manager.get_file("kernel.cubin") is None
    assert len([r for r in warnings_of(caplog) if "are not used" in r.getMessage()]) == 1


def test_precompile_output_is_trusted_under_a_permissive_umask(tmp_path):
    root = make_cache(tmp_path / "cache")
    for path in (root, root / KEY, root / KEY / "kernel.cubin"):
        os.chmod(path, 0o775 if path.is_dir() else 0o664)
    overlay.restrict_to_owner(str(root))
    assert all(overlay.untrusted_reason(str(p)) is None for p in (root, root / KEY, root / KEY / "kernel.cubin"))


def test_a_manifest_others_can_write_is_refused(tmp_path, monkeypatch, clean_activation):
    root = make_cache(tmp_path / "cache")
    os.chmod(root / overlay.MANIFEST, 0o666)
    monkeypatch.setenv(overlay.ENV_CACHE, str(root))
    assert overlay.activate() == []


def test_only_listed_files_with_matching_hashes_are_served(tmp_path, monkeypatch, clean_activation, caplog):
    root = make_cache(tmp_path / "cache")
    monkeypatch.setenv(overlay.ENV_CACHE, str(root))
    assert overlay.activate() == [str(root)]
    from triton import knobs

    manager = knobs.cache.manager_class(KEY)
    assert manager.get_file("kernel.cubin") == str(root / KEY / "kernel.cubin")
    assert manager.get_file("planted.so") is None  # not in the manifest
    (root / KEY / "kernel.cubin").write_bytes(b"\x7fELF replaced by someone")
    with caplog.at_level(logging.WARNING, logger="paged_mqa_logits"):
        assert manager.get_file("kernel.cubin") is None
        assert manager.get_file("kernel.cubin") is None
    assert len([r for r in warnings_of(caplog) if "does not match" in r.getMessage()]) == 1


def test_manifest_writes_are_atomic_for_concurrent_readers(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    big = valid_manifest({f"{KEY}/file{i}.bin": "0" * 64 for i in range(2000)})
    overlay.write_manifest_atomically(str(root), big)
    errors, done = [], threading.Event()

    def reader():
        while not done.is_set():
            try:
                assert len(overlay.read_manifest(str(root))["files"]) == 2000
            except Exception as exc:  # a torn read
                errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    for _ in range(100):
        overlay.write_manifest_atomically(str(root), big)
    done.set()
    thread.join()
    assert not errors
    assert sorted(os.listdir(root)) == [overlay.MANIFEST]  # no temporary file left behind
