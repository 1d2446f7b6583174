"""Build the wheel and the sdist, check what they carry, install the wheel in a fresh venv and run
the demo there (CI's packaging check, `.ci/run`).

    python tools/check_dist.py [--out DIR]

The wheel must carry every shipped table (configs/*.csv as paged_mqa_logits/configs/), the tuner
package (tuner/*.py as paged_mqa_logits/tuner/), the console scripts of pyproject.toml in its
entry_points.txt and the LICENSE; the sdist the same sources. The venv reuses this interpreter's
site-packages (torch, Triton) behind its own, so only the package comes from the wheel; the demo
runs outside the checkout, so it cannot import the sources instead. Exit status 1 names what is
missing."""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import tomllib
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def expected_files() -> tuple[list[str], list[str]]:
    """(paths inside the wheel, paths inside the sdist below its top directory) that must be there."""
    tables = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "configs", "*.csv")))
    tuner = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "tuner", "*.py")))
    wheel = ([f"paged_mqa_logits/configs/{t}" for t in tables] + [f"paged_mqa_logits/tuner/{m}" for m in tuner]
             + ["paged_mqa_logits/__main__.py"])
    sdist = [f"configs/{t}" for t in tables] + [f"tuner/{m}" for m in tuner] + ["LICENSE", "pyproject.toml"]
    return wheel, sdist


def console_scripts() -> dict[str, str]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["scripts"]


def wheel_problems(names: list[str], entry_points: str) -> list[str]:
    """What the wheel whose member names and entry_points.txt text are given lacks."""
    wanted, _ = expected_files()
    problems = [f"wheel lacks {p}" for p in wanted if p not in names]
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
        problems.append("wheel lacks the LICENSE (.dist-info/licenses/LICENSE)")
    lines = {line.replace(" ", "") for line in entry_points.splitlines()}
    problems += [f"wheel's entry_points.txt lacks {name} = {target}" for name, target in console_scripts().items()
                 if f"{name}={target}" not in lines]
    return problems


def sdist_problems(names: list[str]) -> list[str]:
    """What the sdist whose member names (with their top directory) are given lacks."""
    _, wanted = expected_files()
    inside = {n.split("/", 1)[1] for n in names if "/" in n}
    return [f"sdist lacks {p}" for p in wanted if p not in inside]


def build(out: str) -> tuple[str, str]:
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--sdist", "--outdir", out, ROOT], check=True,
                   stdout=subprocess.DEVNULL)
    wheel, = glob.glob(os.path.join(out, "*.whl"))
    sdist, = glob.glob(os.path.join(out, "*.tar.gz"))
    return wheel, sdist


def contents(wheel: str, sdist: str) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = next((z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt")), "")
    with tarfile.open(sdist) as t:
        members = t.getnames()
    return wheel_problems(names, entry_points) + sdist_problems(members)


def install_and_run_demo(wheel: str, out: str) -> None:
    venv = os.path.join(out, "venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    with open(os.path.join(site, "reuse_ci_site_packages.pth"), "w") as f:  # torch and Triton, after the wheel
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", wheel], check=True)
    where = subprocess.run([python, "-c", "import paged_mqa_logits; print(paged_mqa_logits.__file__)"], cwd=out,
                           check=True, capture_output=True, text=True).stdout.strip()
    if not where.startswith(site):
        raise SystemExit(f"the venv imports paged_mqa_logits from {where}, not from the installed wheel in {site}")
    for command in ([python, "-m", "paged_mqa_logits", "demo"],
                    *([os.path.join(venv, "bin", name), "--help"] for name in console_scripts())):
        print("$", " ".join(os.path.relpath(c, out) if c.startswith(out) else c for c in command), flush=True)
        subprocess.run(command, cwd=out, check=True, stdout=None if command[-1] == "demo" else subprocess.DEVNULL)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tools/check_dist.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="directory for the builds and the venv (default: a temporary one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="paged-mqa-logits-dist-") as tmp:
        out = os.path.abspath(args.out or tmp)
        os.makedirs(out, exist_ok=True)
        wheel, sdist = build(out)
        problems = contents(wheel, sdist)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            return 1
        print(f"{os.path.basename(wheel)} and {os.path.basename(sdist)} carry the tables, the tuner, the console "
              "scripts and the license")
        install_and_run_demo(wheel, out)
    print("the wheel installs and runs the demo in a fresh venv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
