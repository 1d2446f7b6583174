import atexit
import os
import sys

import pytest
import torch

# Tests run against the checkout even without an install.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _isolated_dispatch(monkeypatch):
    """Every test starts with the shipped tables, no arch override and an empty dispatch cache."""
    for name in ("PAGED_MQA_LOGITS_CONFIGS", "AITER_CONFIG_PAGED_MQA_LOGITS", "PAGED_MQA_LOGITS_ARCH",
                 "PAGED_MQA_LOGITS_CU_NUM", "AITER_LOG_TUNED_CONFIG", "PAGED_MQA_LOGITS_LOG_TUNED_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    from paged_mqa_logits import reload_tuned_table

    reload_tuned_table()
    yield
    reload_tuned_table()


def gpu_device() -> str | None:
    return "cuda" if torch.cuda.is_available() else None


# ----------------------------------------------------------------------------- test tiers
# The default tier (`python -m pytest -q tests`) holds the essentials: the op's contract, dispatch,
# the tables, the reference and a few compiles per arch. The tests named here (compile matrices'
# samples, the FlyDSL emulator, GPU matrices, torch.compile, subprocess- and process-pool-heavy runs) join them
# in the `full` tier (`-m "not slow"`); `slow` holds the whole matrices. Times: README.md, "Tests".
#: module -> the tests of it that stay in the default tier (all its others are `full`)
FULL_MODULES = {
    "tests/backends/gluon/test_bf16_gpu.py": (),
    "tests/backends/gluon/test_compile_bf16.py": (),
    "tests/backends/gluon/test_compile_mfma.py": ("test_launch_path_binds_specialises_and_compiles",),
    "tests/backends/gluon/test_compile_mma_v2.py": (),
    "tests/backends/gluon/test_compile_wgmma_fp4.py": (),
    "tests/backends/gluon/test_compile_wgmma_pipes.py": (),
    "tests/backends/gluon/test_compile_wgmma_ws.py": (),
    "tests/backends/gluon/test_gluon_gpu.py": ("test_forced_paths", "test_1d_and_2d_lengths_are_bit_identical",
                                               "test_cuda_graph_capture_and_replay"),
    "tests/backends/gluon/test_headsum_gpu.py": ("test_dispatch_and_graph_replay_after_lengths_change",),
    "tests/backends/gluon/test_mfma_headsum.py": (),
    "tests/backends/gluon/test_register_headsum_gpu.py": (),
    "tests/backends/gluon/test_wgmma_fp4_gpu.py": ("test_the_dispatcher_picks_it_and_the_public_op_runs_it",),
    "tests/backends/gluon/test_wgmma_pipes_gpu.py": (),
    "tests/backends/test_compile_flydsl.py": (),
    "tests/backends/test_flydsl_cdna.py": (),
    "tests/backends/test_lds_dma_vs_llvm.py": (),
    "tests/backends/test_schedule_gpu.py": (),
    "tests/test_amd_side_by_side.py": (),
    "tests/test_cmake.py": (),
    "tests/test_kernel_cache.py": (),
    "tests/test_kernel_cache_safety.py": (),
    "tests/test_warmup.py": (),
    "tests/tuner/test_tuner_run.py": (),
    "tests/tuner/test_tuner_safety.py": (),
}
#: module -> the tests of it that are `full` (its others stay in the default tier)
FULL_TESTS = {
    "tests/backends/test_triton_portable.py": ("test_balanced_schedule_on_widely_ragged_batches",),
    "tests/test_block_ids.py": ("test_device_check_flag_is_parsed_at_import",),
    "tests/test_packaging.py": ("test_installed_tuner_runs_as_a_subpackage",),
    "tests/test_schedule.py": ("test_triton_device_share_matches_the_model",),
    "tests/test_torch_op.py": ("test_torch_compile_fullgraph_on_cpu_equals_eager",),
    "tests/top_k/test_topk.py": ("test_sample_split_rows_overflow",),
    "tests/top_k/test_topk_compile.py": ("test_sample_kernel_cross_compiles",
                                         "test_sample_split_row_kernels_cross_compile"),
}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def in_full_tier(module: str, test: str) -> bool:
    """Whether the test function ``test`` of ``module`` (a path from the repository root) is `full`."""
    if module in FULL_MODULES:
        return test not in FULL_MODULES[module]
    return test in FULL_TESTS.get(module, ())


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        module = os.path.relpath(str(item.path), ROOT).replace(os.sep, "/")
        if in_full_tier(module, getattr(item, "originalname", item.name)):
            item.add_marker(pytest.mark.full)


# ----------------------------------------------------------------------------- exit
def _stderr_to_devnull() -> None:
    sys.stderr.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)


def pytest_unconfigure(config):
    """Triton's nanobind bindings (Triton 3.9; 3.6 has pybind11) report at interpreter exit the IR
    objects its compiler still holds (instances, types, hundreds of functions: ~30 lines of
    "nanobind: leaked" after pytest's summary). They are Triton's, held where Python cannot free them,
    and nanobind has no Python switch for the report, so once pytest is done (summary printed, exit
    status set) the interpreter's teardown writes stderr to /dev/null, and only when such a Triton was
    loaded (tests/test_readme.py runs a cold compile in a subprocess and checks the tail)."""
    from paged_mqa_logits.triton_internals.version import nanobind_bindings_loaded

    if nanobind_bindings_loaded():
        atexit.register(_stderr_to_devnull)
