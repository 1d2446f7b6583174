"""The README's commands stay true: CI runs exactly the README's CPU install and test command,
every command, module, console script and file the README names exists, and the numbers the README
and docs/RESULTS.md quote are recomputed from the CSVs they cite."""

import csv
import math
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the docs whose prose lines this test keeps within 120 characters (tables aside)
OWN_DOCS = ("README.md", "docs/DISPATCH.md", "docs/RESULTS.md", "docs/SERVING.md", "docs/TRITON.md")
TEST_COMMAND = "python -m pytest -q tests"


def read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def bash_blocks(text):
    return [b.strip().splitlines() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def quick_start():
    """The Quick start's blocks by platform: {"CUDA": [lines], "ROCm": [...], "CPU": [...]}."""
    section = read("README.md").split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(2).strip().splitlines()
            for m in re.finditer(r"\*\*(\w+)\*\*[^\n]*\n\n```bash\n(.*?)```", section, flags=re.S)}


def ci_lines():
    return [line.strip() for line in read(".ci/run").splitlines() if line.strip() and not line.strip().startswith("#")]


def test_quick_start_has_one_block_per_platform_each_installing_running_the_demo_and_the_tests():
    blocks = quick_start()
    assert set(blocks) == {"CUDA", "ROCm", "CPU"}
    for platform, lines in blocks.items():
        assert lines[-2:] == ["python -m paged_mqa_logits demo", TEST_COMMAND], platform
        assert any(re.fullmatch(r'pip install -e "\.\[[a-z,]+\]"', line) for line in lines), platform
    assert len(read("README.md").splitlines()) <= 200


def test_ci_runs_the_readme_cpu_install_and_nothing_else_before_the_test_command():
    install = [line for line in quick_start()["CPU"] if line.startswith("pip install -e")]
    lines = ci_lines()
    first_test = lines.index(TEST_COMMAND)
    installs = [line for line in lines[:first_test] if "pip install" in line and "--upgrade pip" not in line]
    package = [line for line in installs if " -e " in line]
    assert package == ["python -m " + install[0].replace("pip install", "pip install -q")]
    # besides the package, only torch and the tested Triton: no optional package of CI's own
    others = [line for line in installs if line not in package]
    assert all(re.search(r'"?(torch|triton)==', line) or "whl/cpu" in line for line in others), others
    # the default tier under each Triton version, then the README's AMD compile checks
    loop = lines.index('for version in "${TRITON_VERSIONS[@]}"; do')
    assert lines[lines.index("done", loop) - 1] == TEST_COMMAND
    rocm = lines.index('python -m pip install -q -e ".[rocm]"')
    assert lines[rocm + 1:rocm + 3] == ['python -m pytest -q -m "not slow" tests', "python -m pytest -q -m slow tests"]
    assert "python tools/check_dist.py" in lines[rocm:]
    assert lines[-1] == TEST_COMMAND and "${NEWEST_TORCH}" in "\n".join(lines[rocm:])


def test_the_readme_tier_table_names_the_commands_ci_runs():
    readme, lines = read("README.md"), ci_lines()
    tiers = dict(re.findall(r"^\| ([\w ]+?) \| `([^`]+)`", readme, flags=re.M))
    assert tiers["default"] == TEST_COMMAND and TEST_COMMAND in lines
    for tier in ("full", "slow"):
        assert tiers[tier] in lines, tier
    assert 'pip install -e ".[rocm]"' in readme


def test_ci_installs_cpu_torch_the_newest_torch_and_both_ends_of_the_tested_triton_range():
    from paged_mqa_logits.triton_internals.version import MINIMUM_TRITON, TESTED_TRITON, parse_version

    ci, triton_doc, readme = read(".ci/run"), " ".join(read("docs/TRITON.md").split()), read("README.md")
    assert "torch==2.13.0" in ci and "download.pytorch.org/whl/cpu" in ci and '-e ".[triton,test]"' in ci
    versions = re.findall(r'"(\d+\.\d+\.\d+)"', re.search(r"TRITON_VERSIONS=\((.*)\)", ci).group(1))
    assert [parse_version(v) for v in versions] == list(TESTED_TRITON)
    low = re.search(r'triton = \["triton>=(\d+\.\d+)"\]', read("pyproject.toml")).group(1)
    assert parse_version(low) == MINIMUM_TRITON
    newest = re.search(r'NEWEST_TORCH="(\d+\.\d+)\.\d+"', ci).group(1)
    tested = " and ".join(".".join(map(str, v[:2])) for v in TESTED_TRITON)
    assert f"Triton {low} and newer" in triton_doc and f"tested: {tested}" in triton_doc
    assert f"torch 2.11 to {newest}" in triton_doc
    assert f"torch 2.11-{newest}" in readme and f"Triton {low}+" in readme


# ----------------------------------------------------------------------------- what the README names
def python_m_modules(text):
    return set(re.findall(r"python -m ([\w.]+)", text))


def module_file(module):
    """The file ``python -m module`` runs from a checkout or an install, by pyproject's package-dir."""
    parts = module.split(".")
    if parts[:2] == ["paged_mqa_logits", "tuner"]:
        parts = ["tuner"] + parts[2:]
    base = os.path.join(ROOT, *parts)
    for candidate in (os.path.join(base, "__main__.py"), base + ".py"):
        if os.path.isfile(candidate):
            return candidate
    return None


def test_every_module_the_readme_runs_exists():
    text = read("README.md")
    modules = python_m_modules(text) - {"pytest", "pip"}
    assert {"paged_mqa_logits", "paged_mqa_logits.tuner"} <= modules
    missing = sorted(m for m in modules if module_file(m) is None)
    assert not missing, missing


def test_every_subcommand_and_console_script_the_readme_names_exists():
    from paged_mqa_logits.__main__ import COMMANDS

    text = read("README.md")
    named = set(re.findall(r"python -m paged_mqa_logits (\w+)", text))
    for group in re.findall(r"python -m paged_mqa_logits \{([^}]*)\}", text):
        named |= {name.strip() for name in group.split(",")}
    assert named and named <= set(COMMANDS), named - set(COMMANDS)
    scripts = set(re.findall(r'^(paged-mqa-logits[\w-]*) = "', read("pyproject.toml"), flags=re.M))
    assert set(re.findall(r"`(paged-mqa-logits[\w-]*)`", text)) <= scripts


def test_every_path_the_readme_and_its_docs_cite_exists():
    missing = []
    for doc in OWN_DOCS:
        for path in re.findall(r"`?((?:paged_mqa_logits|tools|tests|configs|docs|benchmarks|\.ci)/[\w./-]*\w)`?",
                               read(doc)):
            if not os.path.exists(os.path.join(ROOT, path)) and not path.endswith("_"):  # a glob's stem
                missing.append(f"{doc}: {path}")
    assert not missing, missing


def test_prose_lines_of_the_readme_and_its_docs_fit_120_characters():
    long = [f"{doc}:{n}" for doc in OWN_DOCS for n, line in enumerate(read(doc).splitlines(), 1)
            if len(line) > 120 and not line.startswith("|")]
    assert not long, long


# ----------------------------------------------------------------------------- the numbers quoted
def geomean(values):
    return math.exp(sum(map(math.log, values)) / len(values))


def bench_rows(mode):
    with open(os.path.join(ROOT, "benchmarks", "h200", f"bench_grid_{mode}.csv")) as f:
        return [r for r in csv.DictReader(line for line in f if not line.startswith("#")) if r["impl"] == "dispatch"]


def quoted(ratios):
    return f"{geomean(ratios):.3f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def test_the_results_table_is_the_bench_csvs():
    rows = {mode: bench_rows(mode) for mode in ("uniform", "wide_ragged")}
    columns = [(64, "uniform"), (64, "wide_ragged"), (32, "uniform"), (32, "wide_ragged")]
    table = [line for line in read("docs/RESULTS.md").splitlines() if re.match(r"\| (32|64|32, 64) \| \d", line)]
    assert len(table) == 7
    for line in table:
        cells = [c.strip() for c in line.strip("|").split("|")]
        heads, next_n = {int(h) for h in cells[0].split(",")}, int(cells[1].split()[0])
        for cell, (block, mode) in zip(cells[2:], columns):
            ratios = [float(r["speedup_vs_deepgemm"]) for r in rows[mode] if int(r["H"]) in heads
                      and int(r["next_n"]) == next_n and int(r["kv_block_size"]) == block]
            assert ratios and cell == quoted(ratios), (line, block, mode)


def test_the_whole_grid_geomeans_in_the_readme_and_the_results_are_the_bench_csvs():
    readme, results = " ".join(read("README.md").split()), " ".join(read("docs/RESULTS.md").split())
    grid = {mode: f"{geomean([float(r['speedup_vs_deepgemm']) for r in bench_rows(mode) if r['next_n'] != '3']):.3f}x"
            for mode in ("uniform", "wide_ragged")}
    assert f"**{grid['uniform']} uniform, {grid['wide_ragged']} widely ragged**" in results
    assert f"runs at {grid['uniform']} DeepGEMM's" in readme and f"({grid['wide_ragged']} on widely ragged" in readme


def test_the_amd_estimates_are_the_side_by_side_report():
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import amd_side_by_side as sbs

    with open(os.path.join(ROOT, "benchmarks", "amd", "side_by_side.csv")) as f:
        comparison = sbs.comparison(list(csv.DictReader(f)))
    ratio = {(arch, of): f"{geomean([c['ours'] / c[of] for c in comparison if c['arch'] == arch]):.2f}x"
             for arch in ("gfx942", "gfx950") for of in ("aiter_default", "aiter_best")}
    text = " ".join(read("docs/RESULTS.md").split())
    assert (f"estimated at {ratio['gfx942', 'aiter_default']} (gfx942) and {ratio['gfx950', 'aiter_default']} "
            f"(gfx950) of AITER's default cycles per 64 keys (geomean; {ratio['gfx942', 'aiter_best']} and "
            f"{ratio['gfx950', 'aiter_best']} of its best knobs)") in text


# ----------------------------------------------------------------------------- the test tiers
def test_the_tiers_name_tests_that_exist():
    import conftest

    for module, tests in [*conftest.FULL_MODULES.items(), *conftest.FULL_TESTS.items()]:
        assert os.path.isfile(os.path.join(ROOT, module)), module
        source = read(module)
        for test in tests:
            assert re.search(rf"^def {test}\(", source, flags=re.M), (module, test)


@pytest.mark.parametrize("module,test,full", [
    ("tests/backends/test_compile_flydsl.py", "test_anything", True),
    ("tests/backends/gluon/test_compile_cdna.py", "test_launch_path_binds_specialises_and_compiles", False),
    ("tests/test_torch_op.py", "test_torch_compile_fullgraph_on_cpu_equals_eager", True),
    ("tests/test_torch_op.py", "test_anything_else", False),
    ("tests/test_dispatch.py", "test_anything", False),
])
def test_tier_of_a_test(module, test, full):
    import conftest

    assert conftest.in_full_tier(module, test) is full


def test_no_nanobind_leak_report_after_the_summary(tmp_path):
    """A cold compile (fresh Triton cache) leaves Triton's IR objects alive at exit; under a Triton
    with nanobind bindings their report must not follow pytest's summary (tests/conftest.py)."""
    import subprocess

    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_compile.py", "-k",
                          "test_amd_resources_agree_with_the_code_object_metadata"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "1 passed" in run.stdout.strip().splitlines()[-1]
    assert "nanobind" not in run.stdout + run.stderr
