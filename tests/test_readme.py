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
    install, tests, slow = blocks[0], blocks[1], blocks[2]
    assert "pip install" in install and "python -m paged_mqa_logits demo" in install
    assert tests == "python -m pytest -q tests" and slow == "python -m pytest -q -m slow tests"
    ci_lines = [line.strip() for line in read(".ci/run").splitlines() if line.strip() and not line.startswith("#")]
    # under each Triton version CI runs the README's test command, then, under the oldest (the
    # H200's), the slow set
    loop = ci_lines.index('for version in "${TRITON_VERSIONS[@]}"; do')
    end = ci_lines.index("done", loop)
    assert ci_lines[end - 4:end] == [tests, 'if [[ "${version}" == "${TRITON_VERSIONS[0]}" ]]; then', slow, "fi"]
    # and, last, the README's test command under the newest torch
    assert ci_lines[-1] == tests and "${NEWEST_TORCH}" in "\n".join(ci_lines[end:])


def test_ci_installs_cpu_torch_the_newest_torch_and_both_ends_of_the_tested_triton_range():
    from paged_mqa_logits.triton_internals.version import MINIMUM_TRITON, TESTED_TRITON, parse_version

    ci, readme = read(".ci/run"), read("README.md")
    assert "torch==2.13.0" in ci and "download.pytorch.org/whl/cpu" in ci and '-e ".[triton,test]"' in ci
    versions = re.findall(r'"(\d+\.\d+\.\d+)"', re.search(r"TRITON_VERSIONS=\((.*)\)", ci).group(1))
    assert [parse_version(v) for v in versions] == list(TESTED_TRITON)
    low = re.search(r'triton = \["triton>=(\d+\.\d+)"\]', read("pyproject.toml")).group(1)
    assert parse_version(low) == MINIMUM_TRITON
    newest = re.search(r'NEWEST_TORCH="(\d+\.\d+)\.\d+"', ci).group(1)
    assert f"Triton {low} and newer" in readme and "tested: 3.6 and 3.9" in readme
    assert f"torch 2.11 to {newest}" in readme
