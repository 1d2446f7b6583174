"""The driver's C modules (paged_mqa_logits/triton_internals/launchers.py): which Triton builds
launcher stubs per kernel signature, and the libcuda a launcher links against."""

import os

from paged_mqa_logits.triton_internals import launchers
from paged_mqa_logits.triton_internals.version import version


def test_per_kernel_launchers_only_before_3_7():
    assert launchers.per_kernel_launchers() is (version() < (3, 7))


def test_libcuda_dir_holds_a_libcuda_real_or_placeholder():
    directory = launchers.libcuda_dir()
    assert os.path.exists(os.path.join(directory, "libcuda.so.1"))
    assert launchers.libcuda_dir() == directory  # found or built once per process
