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
    # the shipped untuned lists are installed too, and found by name (there is no configs/ here)
    shipped = subprocess.run([sys.executable, "-m", "paged_mqa_logits.tuner", "configs/glm5_untuned.csv",
                              "dsv32_untuned.csv", "--dry-run", "--arch", "sm90", "--backends", "torch"],
                             capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    assert "key(s) to tune on sm_90/cu132" in shipped.stdout


#: third-party modules the package imports that are not plain dependencies, and why
NOT_DEPENDENCIES = {
    "triton": "torch brings it under its own distribution name; the `triton` extra for CPU torch",
    "flydsl": "the `rocm` extra (its backend loads it lazily)",
    "deep_gemm": "the bench's optional same-run comparison",
}


def _third_party_imports() -> set[str]:
    import ast

    found = set()
    for package in ("paged_mqa_logits", "tuner"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in (n for n in files if n.endswith(".py")):
                tree = ast.parse(open(os.path.join(folder, name)).read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.Import):
                        found |= {alias.name.split(".")[0] for alias in node.names}
                    elif isinstance(node, ast.ImportFrom) and not node.level:
                        found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"paged_mqa_logits", "tuner", "__future__"}


def test_the_declared_dependencies_are_what_the_package_imports():
    import re
    import tomllib

    project = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]

    def names(requirements):
        return {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in requirements}

    assert names(project["dependencies"]) == _third_party_imports() - set(NOT_DEPENDENCIES)
    extras = project["optional-dependencies"]
    assert "triton" not in names(project["dependencies"])  # never over the Triton torch brings
    assert extras["triton"] == ["triton>=3.6"] and names(extras["rocm"]) == {"flydsl"}


def _dummy_wheel(folder, name: str, version: str, requires=(), files=None):
    """A minimal pure-Python wheel of ``name`` (what pip needs to resolve and install it)."""
    import base64
    import hashlib

    stem = f"{name.replace('-', '_')}-{version}"
    contents = dict(files or {})
    contents[f"{stem}.dist-info/METADATA"] = "\n".join(
        ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"] + [f"Requires-Dist: {r}" for r in requires]) + "\n"
    contents[f"{stem}.dist-info/WHEEL"] = "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(text.encode())}" for path, text in contents.items()]
    contents[f"{stem}.dist-info/RECORD"] = "\n".join(record + [f"{stem}.dist-info/RECORD,,"]) + "\n"
    path = os.path.join(folder, f"{stem}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as archive:
        for name_in_wheel, text in contents.items():
            archive.writestr(name_in_wheel, text)
    return path


def test_a_rocm_torch_keeps_its_triton(wheel, tmp_path):
    """Beside a torch that brings Triton as ``pytorch-triton-rocm`` (as ROCm builds do), installing
    the package resolves without pulling the CUDA ``triton`` wheel over it, although that wheel
    is on the index. Offline: stand-in wheels for torch, its Triton and the other dependencies."""
    import tomllib

    index = tmp_path / "index"
    index.mkdir()
    _dummy_wheel(index, "torch", "2.13.0", requires=["pytorch-triton-rocm==3.9.0"])
    _dummy_wheel(index, "pytorch-triton-rocm", "3.9.0", files={"triton/__init__.py": "__version__ = '3.9.0'  # rocm\n"})
    _dummy_wheel(index, "triton", "3.9.0", files={"triton/__init__.py": "__version__ = '3.9.0'  # cuda\n"})
    project = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]
    for requirement in project["dependencies"]:
        if requirement != "torch":
            _dummy_wheel(index, requirement, "1.0.0")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no index, cap or find-links of this machine's configuration

    def pip(*args):
        done = subprocess.run([sys.executable, "-m", "pip", "--python", python, *args], capture_output=True,
                              text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    pip("install", "-q", "--no-index", "--find-links", str(index), "torch")  # the user's ROCm torch
    pip("install", "-q", "--no-index", "--find-links", str(index), str(wheel))
    import json

    installed = {d["name"].lower().replace("_", "-") for d in json.loads(pip("list", "--format=json"))}
    assert {"paged-mqa-logits", "torch", "pytorch-triton-rocm"} <= installed and "triton" not in installed, installed
    triton_init = subprocess.run([python, "-c", "import triton, inspect; print(inspect.getsource(triton))"],
                                 capture_output=True, text=True, check=True).stdout
    assert "# rocm" in triton_init
