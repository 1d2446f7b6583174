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
    assert ci_lines[-1] == tests


def test_ci_installs_cpu_torch_and_pinned_triton():
    ci = read(".ci/run")
    assert "torch==2.13.0" in ci and "download.pytorch.org/whl/cpu" in ci
    assert '"triton==3.6.0"' in ci and '-e ".[test]"' in ci
