"""The README's two commands stay true: CI runs exactly the README's test command."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def bash_blocks(text):
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_readme_commands_and_ci_agree():
    blocks = bash_blocks(read("README.md"))
    install, tests = blocks[0], blocks[1]
    assert "pip install" in install and "python -m paged_mqa_logits demo" in install
    assert tests == "python -m pytest -q tests"
    ci_lines = [line.strip() for line in read(".ci/run").splitlines() if line.strip() and not line.startswith("#")]
    # the last thing CI does, once per Triton version, is the README's test command
    loop = ci_lines.index('for version in "${TRITON_VERSIONS[@]}"; do')
    assert ci_lines[-2:] == [tests, "done"] and loop < len(ci_lines) - 2


def test_ci_installs_cpu_torch_and_both_ends_of_the_supported_triton_range():
    from paged_mqa_logits.triton_internals.version import TESTED_TRITON, parse_version

    ci = read(".ci/run")
    assert "torch==2.13.0" in ci and "download.pytorch.org/whl/cpu" in ci and '-e ".[test]"' in ci
    versions = re.findall(r'"(\d+\.\d+\.\d+)"', re.search(r"TRITON_VERSIONS=\((.*)\)", ci).group(1))
    assert [parse_version(v) for v in versions] == list(TESTED_TRITON)
    low, high = re.search(r'"triton>=(\d+\.\d+),<(\d+\.\d+)"', read("pyproject.toml")).groups()
    assert parse_version(low) == TESTED_TRITON[0]
    assert parse_version(high) == (TESTED_TRITON[1][0], TESTED_TRITON[1][1] + 1)  # the newest tested minor + 1
    assert "3.6 through 3.9" in read("README.md") and f"<{high}" in read("README.md")
