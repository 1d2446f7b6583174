"""The CLI as users run it: the demo on this machine, explain for every target arch."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, env=None):
    full_env = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
    return subprocess.run([sys.executable, "-m", "paged_mqa_logits", *args], capture_output=True, text=True,
                          cwd=ROOT, env=full_env, timeout=600)


def test_demo_passes():
    result = run("demo")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "dispatch: backend=" in result.stdout and "PASS" in result.stdout


def test_demo_options():
    result = run("demo", "--batch", "2", "--next-n", "3", "--heads", "32", "--context", "300",
                 "--kv-block-size", "16", "--preshuffle", "--lens-1d", "--backend", "triton")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "forced backend=triton" in result.stdout and "PASS" in result.stdout


@pytest.mark.parametrize("arch,cu", [("gfx942", 304), ("gfx950", 256), ("sm90", 132)])
def test_explain_answers_without_gpu(arch, cu):
    result = run("explain", "--arch", arch, "--cu-num", str(cu), "--batch", "64", "--next-n", "2", "--heads", "32",
                 "--context", "8192")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("backend : ") and "rule    : " in out and "knobs   : " in out
    backend = out.splitlines()[0].split(":")[1].strip()
    assert backend in ("gluon", "flydsl", "triton", "torch")


def test_explain_logs_nothing_and_usage():
    result = run()
    assert result.returncode == 2 and "demo" in result.stdout and "explain" in result.stdout
    assert run("--help").returncode == 0
