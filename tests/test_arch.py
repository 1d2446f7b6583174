"""``paged_mqa_logits.arch``: arch names normalised (``sm90``, ``gfx950:sramecc+:xnack-``), CPU tensors
detected as CPU even under the ``PAGED_MQA_LOGITS_ARCH`` override (which says once why it is ignored), the
override applied to GPU info with bad values naming the variable, fp8 support per arch, and (GPU only) detection
of the real device."""

import pytest
import torch

from paged_mqa_logits import arch


@pytest.mark.parametrize("given,expected", [("sm90", "sm_90"), ("SM_90", "sm_90"), ("90", "sm_90"),
                                            ("gfx950:sramecc+:xnack-", "gfx950"), ("gfx942", "gfx942")])
def test_normalise(given, expected):
    assert arch.normalise_arch(given) == expected


def test_cpu_tensors_are_cpu_even_with_override(monkeypatch):
    monkeypatch.setenv("PAGED_MQA_LOGITS_ARCH", "gfx950")
    assert arch.detect("cpu") == arch.ArchInfo("cpu", 0)


def test_override_applies_to_gpu_info(monkeypatch):
    monkeypatch.setenv("PAGED_MQA_LOGITS_ARCH", "gfx950")
    monkeypatch.setenv("PAGED_MQA_LOGITS_CU_NUM", "256")
    assert arch.apply_override(arch.ArchInfo("sm_90", 132)) == arch.ArchInfo("gfx950", 256)


@pytest.mark.parametrize("variable,value", [("PAGED_MQA_LOGITS_CU_NUM", "many"), ("PAGED_MQA_LOGITS_CU_NUM", "-1"),
                                            ("PAGED_MQA_LOGITS_CU_NUM", "\u00b2"),  # a digit to str.isdigit, not to int
                                            ("PAGED_MQA_LOGITS_CU_NUM", "0"), ("PAGED_MQA_LOGITS_ARCH", "abc"),
                                            ("PAGED_MQA_LOGITS_ARCH", "-1")])
def test_bad_override_values_name_the_variable(monkeypatch, variable, value):
    """Rejected where they are read, CPU calls included, as the documented error subclass."""
    from paged_mqa_logits import PagedMQAArgumentError
    from paged_mqa_logits.errors import PagedMQAEnvironmentError

    monkeypatch.setenv(variable, value)
    for detect in (lambda: arch.apply_override(arch.ArchInfo("sm_90", 132)), lambda: arch.detect("cpu")):
        with pytest.raises(PagedMQAEnvironmentError, match=f"environment variable {variable}: expected .*got '{value}'"):
            detect()
    assert issubclass(PagedMQAEnvironmentError, PagedMQAArgumentError)


def test_fp8_support():
    assert arch.ArchInfo("gfx942", 304).supports_fp8("fnuz") and not arch.ArchInfo("gfx942", 304).supports_fp8("fn")
    assert arch.ArchInfo("gfx950", 256).supports_fp8("fn") and not arch.ArchInfo("gfx950", 256).supports_fp8("fnuz")
    assert arch.ArchInfo("sm_90", 132).supports_fp8("fn") and not arch.ArchInfo("sm_90", 132).supports_fp8("fnuz")
    assert arch.ArchInfo("cpu", 0).supports_fp8("fn") and arch.ArchInfo("cpu", 0).supports_fp8("fnuz")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_detect_gpu():
    info = arch.detect("cuda")
    assert info.cu_num > 0 and (info.arch.startswith("sm_") or info.arch.startswith("gfx"))


def test_an_arch_override_on_cpu_tensors_says_once_why_it_is_ignored(monkeypatch, caplog):
    arch._say_override_ignored.cache_clear()
    monkeypatch.setenv("PAGED_MQA_LOGITS_ARCH", "gfx950")
    with caplog.at_level("WARNING", logger="paged_mqa_logits"):
        assert arch.detect("cpu") == arch.ArchInfo("cpu", 0)
        assert arch.detect("cpu") == arch.ArchInfo("cpu", 0)
    lines = [r.getMessage() for r in caplog.records if "PAGED_MQA_LOGITS_ARCH" in r.getMessage()]
    assert len(lines) == 1 and "gfx950 is ignored for CPU tensors" in lines[0]
