"""The command line as users run it: the demo and explain answer; every error is one stderr
line naming what is wrong with a non-zero exit status, and ``--debug`` shows the traceback."""

import os
import subprocess
import sys

import pytest

from paged_mqa_logits import __main__ as pml_cli
from paged_mqa_logits import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, env=None):
    full_env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    return subprocess.run([sys.executable, "-m", "paged_mqa_logits", *args], capture_output=True, text=True,
                          cwd=ROOT, env=full_env, timeout=600)


def run_main(capsys, *args):
    """In-process ``python -m paged_mqa_logits ARGS``: (exit status, stdout, stderr lines)."""
    rc = pml_cli.main(list(args))
    out, err = capsys.readouterr()
    return rc, out, [line for line in err.splitlines() if line.strip()]


def assert_one_line_error(rc, err_lines, *needles):
    assert rc != 0
    assert len(err_lines) == 1, err_lines
    assert ": error: " in err_lines[0]
    for needle in needles:
        assert needle in err_lines[0], err_lines[0]


# ----------------------------------------------------------------------------- answers
def test_demo_passes():
    result = run("demo")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "dispatch: backend=" in result.stdout and "PASS" in result.stdout


def test_demo_options_are_honoured(capsys):
    rc, out, _ = run_main(capsys, "demo", "--batch", "2", "--next-n", "3", "--heads", "32", "--context", "300",
                          "--kv-block-size", "16", "--preshuffle", "--lens-1d", "--backend", "triton",
                          "--head-dim", "128", "--device", "cpu", "--seed", "5")
    assert rc == 0, out
    assert "batch=2 next_n=3 heads=32 head_dim=128 kv_block_size=16 preshuffle=1 context=300 lens_2d=0" in out
    assert "forced backend=triton" in out and "PASS" in out


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_demo_with_mxfp4_inputs_and_bf16_logits(capsys, backend):
    rc, out, _ = run_main(capsys, "demo", "--batch", "2", "--heads", "16", "--context", "100", "--kv-block-size", "16",
                          "--kv-format", "fp4", "--logits-dtype", "bf16", "--backend", backend, "--device", "cpu")
    assert rc == 0 and "kv_format=fp4 logits_dtype=bf16" in out and "PASS" in out, out


def test_explain_with_a_format_names_the_backends_that_decline_it(capsys):
    # 32 heads: no fp4 rows (the table's fp4 rows, all Triton, are for 64 heads); a preshuffled
    # cache: sm_90's MXFP4 kernel (gluon wgmma_fp4) reads plain caches only
    rc, out, _ = run_main(capsys, "explain", "--arch", "sm90", "--kv-format", "fp4", "--logits-dtype", "bf16",
                          "--heads", "32", "--preshuffle")
    assert rc == 0 and "kv_format=fp4 logits_dtype=bf16" in out and "backend : triton" in out
    assert "skipped : gluon: no gluon variant serves this problem" in out
    assert "wgmma_fp4: a preshuffled MXFP4 cache is not read by this kernel" in out
    assert "wgmma: gluon/wgmma kernels read fp8 queries and keys, not fp4" in out
    rc, out, _ = run_main(capsys, "explain", "--arch", "sm90", "--kv-format", "fp4", "--heads", "32")
    assert rc == 0 and "backend : gluon" in out and "variant=wgmma_fp4" in out


@pytest.mark.parametrize("arch,cu", [("gfx942", 304), ("gfx950", 256), ("sm90", 132)])
def test_explain_echoes_the_problem_and_defaults_the_cu_count(capsys, arch, cu):
    rc, out, err = run_main(capsys, "explain", "--arch", arch, "--batch", "64", "--next-n", "2", "--heads", "32",
                            "--context", "8192")
    assert rc == 0 and not err
    lines = out.splitlines()
    assert lines[0].startswith("problem : ") and f"cu_num={cu} batch=64 next_n=2 heads=32" in lines[0]
    assert lines[1].startswith("backend : ") and "rule    : " in out and "knobs   : " in out
    assert lines[1].split(":")[1].strip() in ("gluon", "flydsl", "triton", "torch")


def test_explain_cu_num_is_honoured(capsys):
    rc, out, _ = run_main(capsys, "explain", "--arch", "gfx950", "--cu-num", "80")
    assert rc == 0 and "cu_num=80 " in out


def test_usage(capsys):
    rc, out, _ = run_main(capsys)
    assert rc == 2 and "demo" in out and "explain" in out and "precompile" in out
    rc, out, _ = run_main(capsys, "--help")
    assert rc == 0 and "--debug" in out


# ----------------------------------------------------------------------------- errors
def test_an_unsupported_arch_gets_one_answer_from_every_command(capsys):
    from tuner import __main__ as tuner_cli

    answers = []
    for command in (["explain", "--arch", "sm_80"], ["compile", "--backend", "gluon", "--arch", "sm_80"]):
        rc, _, err = run_main(capsys, *command)
        answers.append((rc, err))
    rc = tuner_cli.main([os.path.join(ROOT, "configs", "glm5_untuned.csv"), "--dry-run", "--arch", "sm_80"])
    answers.append((rc, [line for line in capsys.readouterr().err.splitlines() if line.strip()]))
    for rc, err in answers:
        assert rc == cli.USAGE_ERROR and len(err) == 1, err
        assert err[0].endswith(": error: argument --arch: expected one of "
                               + ("gfx942, gfx950, sm_90" if "compile" in err[0] else "cpu, gfx942, gfx950, sm_90")
                               + ", got sm_80"), err[0]


def test_bench_on_a_cpu_runs_a_small_grid_and_says_what_it_ran(capsys):
    rc, out, err = run_main(capsys, "bench", "--quiet", "--device", "cpu")
    assert rc == 0, err
    run_line = next(line for line in out.splitlines() if line.startswith("# run: "))
    assert "8 shape(s) (heads 32,64 x next_n 1,2 x batch 1,8 x context 4096 x kv_block_size 64; CPU defaults " \
           "for heads, next_n, batch, context, kv_block_size), timing dispatch, 3 replay(s) per measurement on cpu" in run_line


@pytest.mark.parametrize("args,needles", [
    (["explain", "--arch", "gfx942", "--next-n", "9"], ["--next-n", "1..8", "got 9"]),
    (["explain", "--arch", "gfx942", "--heads", "17"], ["--heads", "multiple of 16", "got 17"]),
    (["explain", "--arch", "gfx942", "--head-dim", "64"], ["--head-dim", "128", "got 64"]),
    (["explain", "--arch", "gfx942", "--kv-block-size", "48"], ["--kv-block-size", "one of 1, 16", "got 48"]),
    (["explain", "--arch", "gfx942", "--kv-block-size", "1", "--preshuffle"], ["--kv-block-size", "Preshuffle"]),
    (["explain", "--arch", "gfx942", "--batch", "0"], ["--batch", ">= 1", "got 0"]),
    (["explain", "--arch", "mi999"], ["--arch", "gfx942", "got mi999"]),
    (["explain", "--arch", "gfx942", "--cu-num", "0"], ["--cu-num", "got 0"]),
    (["explain", "--arch", "gfx942", "--context", "-1"], ["--context", "got -1"]),
    (["explain"], ["--arch", "required"]),
    (["explain", "--arch", "gfx942", "--batch", "many"], ["--batch", "many"]),
    (["explain", "--arch", "gfx942", "--kv-format", "fp6"], ["--kv-format", "fp6"]),
    (["demo", "--logits-dtype", "fp16"], ["--logits-dtype", "fp16"]),
    (["explain", "--arch", "gfx942", "--frob"], ["--frob"]),
    (["demo", "--batch", "0"], ["--batch", "got 0"]),
    (["demo", "--context", "0"], ["--context", "got 0"]),
    (["demo", "--head-dim", "64"], ["--head-dim", "got 64"]),
    (["demo", "--next-n", "12"], ["--next-n", "got 12"]),
    (["demo", "--device", "tpu"], ["--device", "'tpu'"]),
    (["demo", "--backend", "nonesuch"], ["--backend", "nonesuch"]),
    (["demo", "--backend", "gluon", "--context", "64", "--batch", "1"], ["gluon", "cannot serve"]),
    (["compile", "--backend", "gluon", "--arch", "gfx1"], ["gfx1"]),
    (["compile", "--backend", "cuda", "--arch", "gfx942"], ["--backend", "cuda"]),
    (["precompile", "--arch", "gfx942", "--out", "x", "--heads", "a,b"], ["--heads", "a,b"]),
    (["bench", "--frob"], ["--frob"]),
    (["bench", "--heads", "24", "--device", "cpu"], ["argument --heads: expected a positive multiple of 16", "got 24"]),
    (["bench", "--next-n", "9", "--device", "cpu"], ["argument --next-n: expected in 1..8, got 9"]),
    (["frobnicate"], ["unknown command", "frobnicate"]),
])
def test_errors_are_one_line_naming_the_problem(capsys, args, needles):
    rc, out, err = run_main(capsys, *args)
    assert_one_line_error(rc, err, *needles)


def test_demo_on_a_missing_gpu(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, _, err = run_main(capsys, "demo", "--device", "cuda")
    assert_one_line_error(rc, err, "--device", "no CUDA/ROCm GPU", "'cuda'")
    rc, _, err = run_main(capsys, "bench", "--device=cuda:0", "--batch", "1")
    assert_one_line_error(rc, err, "--device", "no CUDA/ROCm GPU", "'cuda:0'")


def test_demo_inputs_take_the_rocm_devices_fp8_flavour(monkeypatch):
    """On ROCm the demo's q and keys are in the device's fp8 (fnuz on gfx942), elsewhere fn."""
    import torch

    from paged_mqa_logits import __main__ as main_module
    from paged_mqa_logits import arch

    assert main_module._demo_fp8("cpu") == torch.float8_e4m3fn
    monkeypatch.setattr(torch.version, "hip", "6.4", raising=False)
    monkeypatch.setattr(arch, "detect", lambda device=None: arch.ArchInfo(arch="gfx942", cu_num=304))
    assert main_module._demo_fp8("cuda") == torch.float8_e4m3fnuz
    assert main_module._demo_fp8("cpu") == torch.float8_e4m3fn


def test_bad_table_is_one_line(capsys, monkeypatch, tmp_path):
    bad = tmp_path / "broken_tuned.csv"
    bad.write_text("arch,cu_num\nsm_90,132\n")
    monkeypatch.setenv("PAGED_MQA_LOGITS_CONFIGS", str(bad))
    from paged_mqa_logits import reload_tuned_table

    reload_tuned_table()
    rc, _, err = run_main(capsys, "explain", "--arch", "sm90")
    assert_one_line_error(rc, err, "broken_tuned.csv", "--debug")


@pytest.mark.parametrize("command", [("explain", "--arch", "sm90"),
                                     ("demo", "--device", "cpu", "--batch", "1", "--context", "64", "--heads", "16")])
def test_a_missing_configs_file_is_one_line_naming_the_variable_and_the_path(capsys, monkeypatch, tmp_path, command):
    missing = tmp_path / "gone_tuned.csv"
    monkeypatch.setenv("PAGED_MQA_LOGITS_CONFIGS", str(missing))
    from paged_mqa_logits import reload_tuned_table

    reload_tuned_table()
    rc, _, err = run_main(capsys, *command)
    assert_one_line_error(rc, err, "environment variable PAGED_MQA_LOGITS_CONFIGS", str(missing))


def test_missing_optional_package_is_one_line(capsys, monkeypatch):
    """A missing flydsl (the rocm extra) is named with the install command."""
    monkeypatch.setitem(sys.modules, "flydsl", None)  # import flydsl -> ImportError(name="flydsl")

    def needs_flydsl(argv):
        import flydsl  # noqa: F401

    rc = cli.run("prog", needs_flydsl, [])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert_one_line_error(rc, err, "flydsl", "paged_mqa_logits[rocm]")


def test_compile_without_flydsl_is_one_line(tmp_path):
    """``compile --backend flydsl`` on a machine without FlyDSL: one line naming the package and
    the extra that installs it (a stand-in module that fails to import simulates its absence)."""
    (tmp_path / "flydsl.py").write_text("raise ModuleNotFoundError(\"No module named 'flydsl'\", name='flydsl')\n")
    result = run("compile", "--backend", "flydsl", "--arch", "gfx942",
                 env={"PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])})
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1, result.stderr[-2000:]
    assert "flydsl" in lines[0] and "paged_mqa_logits[rocm]" in lines[0]


def test_debug_shows_the_traceback():
    result = run("explain", "--arch", "gfx942", "--next-n", "9", "--debug")
    assert result.returncode != 0 and "Traceback (most recent call last)" in result.stderr
    assert "--next-n" in result.stderr
    plain = run("explain", "--arch", "gfx942", "--next-n", "9")
    assert plain.returncode == 2 and plain.stderr.count("\n") == 1 and "Traceback" not in plain.stderr
    with pytest.raises(cli.CliError):
        pml_cli.main(["--debug", "explain", "--arch", "gfx942", "--next-n", "9"])


# ----------------------------------------------------------------------------- help
@pytest.mark.parametrize("command", ["demo", "explain", "compile", "precompile", "bench"])
def test_help_shows_defaults(capsys, command):
    with pytest.raises(SystemExit) as exit_:
        pml_cli.main([command, "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and "(default: " in out


def test_explain_cu_num_default_comes_from_the_arch_table(capsys):
    from paged_mqa_logits.arch import USUAL_CU_NUM

    with pytest.raises(SystemExit):
        pml_cli.main(["explain", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert all(f"{arch} {count}" in out for arch, count in USUAL_CU_NUM.items())
