"""With no Triton installed (a CPU build of torch without the ``triton`` extra) the package imports,
the CLI's ``--help``, ``explain`` and a torch-backend ``demo`` work, and what needs Triton says in
one line what to install."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: runs ``python -m paged_mqa_logits ARGS`` in a process where Triton cannot be imported and has
#: no installed distribution, as on a machine that never installed it
NO_TRITON = """
import runpy, sys
from importlib import metadata

class RefuseTriton:
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, RefuseTriton())
installed = metadata.version

def version(dist):
    if "triton" in dist:
        raise metadata.PackageNotFoundError(dist)
    return installed(dist)

metadata.version = version
sys.argv = ["paged_mqa_logits", *sys.argv[1:]]
runpy.run_module("paged_mqa_logits", run_name="__main__")
"""
INSTALL_HINT = "pip install 'paged_mqa_logits[triton]'"


def cli_without_triton(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_TRITON, *args], capture_output=True, text=True, timeout=600)


def test_help_and_explain_answer_without_triton():
    done = cli_without_triton("--help")
    assert done.returncode == 0 and "explain" in done.stdout, done.stderr
    done = cli_without_triton("explain", "--arch", "sm_90", "--batch", "8", "--context", "4096")
    assert done.returncode == 0, done.stderr
    assert "backend : torch" in done.stdout  # the sm_90 chain (gluon, triton, torch) falls back
    assert f"skipped : gluon: backend 'gluon' is unavailable (paged_mqa_logits needs Triton >= 3.6" in done.stdout
    assert INSTALL_HINT in done.stdout
    assert "sm_90_tuned.csv" in done.stdout  # the tables load


def test_the_demo_runs_on_the_torch_backend_without_triton():
    done = cli_without_triton("demo", "--batch", "2", "--context", "256", "--heads", "16")
    assert done.returncode == 0, done.stderr
    assert "backend=torch" in done.stdout and "PASS" in done.stdout


@pytest.mark.parametrize("args", [("demo", "--batch", "2", "--context", "256", "--heads", "16", "--backend", "triton"),
                                  ("compile", "--arch", "sm_90", "--backend", "triton")])
def test_what_needs_triton_says_what_to_install_in_one_line(args):
    done = cli_without_triton(*args)
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert INSTALL_HINT in done.stderr
