"""The gluon variant list loads every module it names or raises: a broken variant module (one
that fails to import, or whose ``VARIANT`` is no :class:`GluonVariant`) is an error naming it,
never a variant that silently disappears from dispatch."""

from __future__ import annotations

import sys

import pytest

from paged_mqa_logits.backends.gluon import VARIANT_MODULES, load_variants, variants


@pytest.fixture
def planted(tmp_path, monkeypatch):
    package = tmp_path / "planted_variants"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "broken.py").write_text("raise RuntimeError('half written')\n")
    (package / "not_a_variant.py").write_text("VARIANT = 3\n")
    (package / "wgmma.py").write_text("from paged_mqa_logits.backends.gluon.wgmma import VARIANT\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "planted_variants"
    for name in [m for m in sys.modules if m.startswith("planted_variants")]:
        del sys.modules[name]


def test_every_listed_module_loads():
    assert [v.name for v in variants()] == ["wgmma", "wgmma_ws", "wgmma_pipes", "mma_v2", "mfma", "wgmma_fp4"]
    assert len(variants()) == len(VARIANT_MODULES)


def test_every_variant_is_named_after_its_modules():
    """One name per variant: its host module ``<name>.py`` and kernel module ``kernels/<name>.py``
    carry the name the tables, configs and docs use (``config["variant"]``)."""
    assert [v.name for v in variants()] == list(VARIANT_MODULES)


def test_a_module_that_fails_to_import_raises_naming_it(planted):
    with pytest.raises(ImportError, match=r"'broken' failed to import: RuntimeError: half written"):
        load_variants(planted, ("wgmma", "broken"))


def test_a_module_without_a_gluon_variant_raises_naming_it(planted):
    with pytest.raises(TypeError, match=r"'not_a_variant': expected VARIANT to be a GluonVariant, got int"):
        load_variants(planted, ("not_a_variant",))
    assert [v.name for v in load_variants(planted, ("wgmma",))] == ["wgmma"]


def test_mma_v2_is_the_sm_90_default_where_the_wgmma_variants_decline():
    """Why ``mma_v2`` stays in production dispatch: wide head counts at long next_n exceed the
    wgmma variants' tiles, and ``mma_v2`` (never tuned) serves them instead of the portable kernel."""
    from paged_mqa_logits.backends.gluon import BACKEND
    from paged_mqa_logits.problem import Problem, ShapeKey, Target

    for heads, next_n in ((128, 5), (256, 3)):
        key = ShapeKey(heads=heads, head_dim=128, kv_block_size=64, preshuffle=False, batch=4, next_n=next_n)
        problem = Problem.of(key, Target.described("sm_90", 132), max_model_len=8192)
        assert [v.name for v in variants() if v.unsupported(problem) is None] == ["mma_v2"]
        assert BACKEND.default_config(problem)["variant"] == "mma_v2"
