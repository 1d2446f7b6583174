"""The tested Triton range (paged_mqa_logits/triton_internals/version.py): version parsing, the
warning outside the range, and a package import that stays free of Triton."""

import subprocess
import sys
import warnings

import pytest

from paged_mqa_logits.triton_internals import version as tv


def test_parse_version():
    assert tv.parse_version("3.9.0") == (3, 9)
    assert tv.parse_version("3.6.0+git1234abcd") == (3, 6)
    assert tv.parse_version("3.10.1rc2") == (3, 10)
    with pytest.raises(ValueError, match="not a Triton version"):
        tv.parse_version("nightly")


@pytest.mark.parametrize("text, tested", [("3.5.1", False), ("3.6.0", True), ("3.7.1", True), ("3.9.0", True),
                                          ("3.10.0", False), ("4.0.0", False)])
def test_tested_range(text, tested):
    assert tv.is_tested(text) is tested


def test_an_untested_triton_warns_once_naming_both_versions(monkeypatch):
    import triton

    monkeypatch.setattr(tv, "_WARNED_UNTESTED", False)
    monkeypatch.setattr(triton, "__version__", "3.10.0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tv.warn_if_untested() is True
        assert tv.warn_if_untested() is False
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "3.10.0" in message and tv.tested_range_text() in message and "3.6 to 3.9" in message


def test_a_tested_triton_does_not_warn(monkeypatch):
    import triton

    monkeypatch.setattr(tv, "_WARNED_UNTESTED", False)
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tv.warn_if_untested() is False


def test_importing_the_package_warns_once_under_an_untested_triton():
    """In a fresh process whose Triton claims 3.10: one warning, however often it is imported."""
    probe = ("import warnings; warnings.simplefilter('always')\n"
             "import triton; triton.__version__ = '3.10.0'\n"
             "with warnings.catch_warnings(record=True) as caught:\n"
             "    warnings.simplefilter('always')\n"
             "    import paged_mqa_logits\n"
             "    import importlib; importlib.reload(paged_mqa_logits)\n"
             "print([str(w.message) for w in caught if 'tested with Triton' in str(w.message)])\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.count("tested with Triton 3.6 to 3.9") == 1 and "Triton 3.10.0" in out, out


def test_the_package_import_does_not_import_triton():
    out = subprocess.run([sys.executable, "-c", "import sys, paged_mqa_logits; print('triton' in sys.modules)"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_importing_the_internals_modules_does_not_import_triton():
    modules = ("version", "gluon_api", "compiler", "specialise", "launchers", "device", "toolchain", "interpreter")
    probe = ("import sys\n"
             + "".join(f"import paged_mqa_logits.triton_internals.{m}\n" for m in modules)
             + "print('triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_no_triton_or_one_older_than_the_minimum_is_a_clear_import_error(monkeypatch):
    monkeypatch.setattr(tv, "installed_version", lambda: None)
    monkeypatch.setattr(tv.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(tv.TritonMissing, match=r"needs Triton >= 3\.6, and this environment has none: .*\[triton\]"):
        tv.require_triton()
    with pytest.raises(tv.TritonMissing, match=r"has Triton 3\.5\.1"):
        tv.require_triton("3.5.1")
    for newer_or_tested in ("3.6.0", "3.9.0", "3.10.0", "4.1.0+rocm7"):
        tv.require_triton(newer_or_tested)  # newer ones only warn (warn_if_untested)


def test_under_an_old_triton_the_package_imports_and_its_triton_backends_say_why_not():
    probe = ("import triton; triton.__version__ = '3.5.1'\nimport paged_mqa_logits\n"
             "from paged_mqa_logits import backends\n"
             "print(backends.get('triton'), backends.load_error('triton'))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("None paged_mqa_logits needs Triton >= 3.6, and this environment has Triton 3.5.1")
