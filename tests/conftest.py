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
