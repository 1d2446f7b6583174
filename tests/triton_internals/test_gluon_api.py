"""The Gluon entry points (paged_mqa_logits/triton_internals/gluon_api.py) resolve to what the
running Triton provides under its own names."""

import pytest

from paged_mqa_logits.triton_internals import gluon_api
from paged_mqa_logits.triton_internals.version import version


def test_gluon_names_resolve_to_the_running_versions_builtins():
    gl = pytest.importorskip("triton.experimental.gluon.language")
    from triton.experimental.gluon.language.nvidia.ampere import async_copy

    major_minor = version()
    copy = gluon_api.async_copy.async_copy_global_to_shared
    assert copy.__name__ == ("async_load" if major_minor >= (3, 8) else "async_copy_global_to_shared")
    assert copy is getattr(async_copy, copy.__name__)
    assert gluon_api.thread_barrier is (gl.barrier if major_minor >= (3, 7) else gl.thread_barrier)
    for name in ("async_copy_global_to_shared", "commit_group", "wait_group"):
        assert getattr(getattr(gluon_api.async_copy, name), "__triton_builtin__", False), name
    for name in ("fence_async_shared", "warpgroup_mma", "warpgroup_mma_wait", "mma_v2", "thread_barrier"):
        assert getattr(getattr(gluon_api, name), "__triton_builtin__", False), name


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        gluon_api.no_such_name  # noqa: B018
