"""What an install puts in site-packages: only ``paged_mqa_logits`` (the tuner as
``paged_mqa_logits.tuner``, never a generic top-level ``tuner``), and the installed tuner runs."""

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _setuptools_new_enough() -> bool:
    if importlib.util.find_spec("setuptools") is None:
        return False
    import setuptools

    return int(setuptools.__version__.split(".")[0]) >= 77  # pyproject.toml's build requirement


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel built from a copy of the checkout's files (the build leaves nothing in the tree)."""
    src = tmp_path_factory.mktemp("src")
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if os.path.isfile(os.path.join(ROOT, name)):
            os.makedirs(os.path.dirname(src / name), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, name), src / name)
    out = tmp_path_factory.mktemp("wheel")
    # Without build isolation when this environment can build (fast, offline); else pip
    # fetches the build requirements.
    flags = ["--no-build-isolation"] if _setuptools_new_enough() else []
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *flags,
                             "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (path,) = out.glob("paged_mqa_logits-*.whl")
    return path


def test_wheel_installs_only_the_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"paged_mqa_logits"}
    for module in ("__main__", "search", "worker", "writer", "keys", "candidates", "recheck"):
        assert f"paged_mqa_logits/tuner/{module}.py" in names
    assert "paged_mqa_logits/compat/deep_gemm.py" in names and "paged_mqa_logits/compat/aiter.py" in names
    assert any(n.startswith("paged_mqa_logits/configs/") and n.endswith("_tuned.csv") for n in names)
    # every module of the package source is in the wheel (a subpackage missing from
    # pyproject's list would install a package that fails on import)
    package = os.path.join(ROOT, "paged_mqa_logits")
    for folder, _, files in os.walk(package):
        if "__pycache__" in folder:
            continue
        for name in files:
            if name.endswith(".py"):
                relative = os.path.relpath(os.path.join(folder, name), ROOT).replace(os.sep, "/")
                assert relative in names, f"{relative} is not in the wheel"
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "paged-mqa-logits-tune = paged_mqa_logits.tuner.__main__:main" in entry_points


def test_installed_tuner_runs_as_a_subpackage(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    keys = tmp_path / "keys.csv"
    keys.write_text("heads,head_dim,kv_block_size,preshuffle,batch,next_n\n64,128,64,0,8,1\n")
    # only the installed copy on the path, run from elsewhere: the checkout's tuner/ is invisible
    env = dict(os.environ, PYTHONPATH=str(target))
    result = subprocess.run([sys.executable, "-m", "paged_mqa_logits.tuner", str(keys), "--dry-run", "--arch", "sm90",
                             "--backends", "torch", "--contexts", "64"], capture_output=True, text=True,
                            cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 key(s) to tune on sm_90/cu132" in result.stdout
    assert not (target / "tuner").exists()
