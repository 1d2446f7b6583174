"""The driver's C modules (paged_mqa_logits/triton_internals/launchers.py): which Triton builds
launcher stubs per kernel signature, and the libcuda a launcher links against."""

import os
import subprocess
import sys

from paged_mqa_logits.triton_internals import launchers
from paged_mqa_logits.triton_internals.version import version


def test_per_kernel_launchers_only_before_3_7():
    assert launchers.per_kernel_launchers() is (version() < (3, 7))


def test_libcuda_dir_holds_a_libcuda_real_or_placeholder():
    directory = launchers.libcuda_dir()
    assert os.path.exists(os.path.join(directory, "libcuda.so.1"))
    assert launchers.libcuda_dir() == directory  # found or built once per process


def test_the_libcuda_placeholder_is_removed_when_the_process_exits(tmp_path):
    probe = ("from paged_mqa_logits.triton_internals import launchers\n"
             "launchers.libcuda_dirs = lambda: []  # as on a machine without the CUDA driver\n"
             "print(launchers.libcuda_dir())\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    stub = done.stdout.strip().splitlines()[-1]
    assert stub.startswith(str(tmp_path)) and not os.path.exists(stub)
    assert not list(tmp_path.glob("paged_mqa_libcuda_stub_*"))
