"""The tuner end to end on CPU, in real worker processes, with real (tiny) timings: the torch
backend and the portable Triton kernel through the interpreter; then resume, merge, the
re-check mode, and a run where candidates crash, hang, raise or compute wrong numbers."""

import time

import pytest

from paged_mqa_logits.backends import registry as backend_registry
from paged_mqa_logits import backends, dispatch, paged_mqa_logits, reload_tuned_table, table
from paged_mqa_logits.problem import ShapeKey
from paged_mqa_logits.reference import make_inputs
from paged_mqa_logits.table import Row
from tuner import Options, recheck, tune
from tuner.writer import write_table

UNTUNED = ("heads,head_dim,kv_block_size,preshuffle,batch,next_n,contexts\n"
           "16,128,16,0,1,1,32;64\n"
           "16,128,16,1,2,2,32;64\n")
FAST = dict(device="cpu", timeout=120, top=1, screen_replays=1, confirm_replays=1, quiet=True)


@pytest.fixture
def registry(monkeypatch):
    """Backends registered by a test (the tuner's extra backends) do not outlive it."""
    monkeypatch.setattr(backend_registry, "_REGISTRY", dict(backend_registry._REGISTRY))
    monkeypatch.setattr(backend_registry, "_LOADED", dict(backend_registry._LOADED))


def old_row(arch, batch, context, backend="torch", us=1.0):
    key = ShapeKey(heads=16, head_dim=128, kv_block_size=16, preshuffle=False, batch=batch, next_n=1)
    return Row(arch, 0 if arch == "cpu" else 256, key, context, backend, (), us, "tuned:old", "")


def test_tune_resume_merge_and_dispatch(tmp_path, registry, monkeypatch):
    untuned = tmp_path / "keys_untuned.csv"
    untuned.write_text(UNTUNED)
    out = str(tmp_path / "cpu_tuned.csv")
    # an existing table: a row of another arch (kept) and a stale row of a key being tuned (replaced)
    write_table(out, [old_row("gfx950", 1, 32, "gluon"), old_row("cpu", 1, 999)])
    opts = Options(untuned=[str(untuned)], out=out, backends=["torch", "triton"], max_candidates=2, jobs=1,
                   report=str(tmp_path / "report.csv"), **FAST)
    outcome = tune(opts)

    assert len(outcome.tuned) == 2 and not outcome.failed and not outcome.left and outcome.restarts == 0
    rows = table.parse_file(out)
    assert ("gfx950", 32) in {(r.arch, r.context) for r in rows}
    mine = [r for r in rows if r.arch == "cpu"]
    assert (sorted((r.shape_key.batch, r.context or 0) for r in mine)
            == [(1, 0), (1, 32), (1, 64), (2, 0), (2, 32), (2, 64)])
    assert all(r.backend in ("torch", "triton") and r.us > 0 for r in mine)
    assert all(r.provenance.startswith("tuned:cpu|cu0|triton") and "|torch" in r.provenance for r in mine)
    report = (tmp_path / "report.csv").read_text()
    assert ",screen,triton," in report and ",confirm," in report and ",screen,torch," in report

    # the table serves the op: dispatch names the file and line of the tuned row
    monkeypatch.setenv(table.ENV_CONFIGS, out)
    reload_tuned_table()
    inp = make_inputs(2, 2, 16, 64, kv_block_size=16, preshuffle=True)
    args = (inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"], inp["context_lens"], inp["kv_indices"],
            inp["max_model_len"], True, 16)
    paged_mqa_logits(*args, context_hint=64)
    choice = next(c for (p, _target), c in dispatch.decisions().items() if p.shape_key.batch == 2)
    assert choice.source.startswith(out + ":") and choice.rule == "exact row"

    # resume: nothing left to do, no worker started, the file untouched
    before, t0 = open(out).read(), time.monotonic()
    again = tune(opts)
    assert len(again.skipped) == 2 and not again.tuned and open(out).read() == before
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("jobs", [0, 1], ids=["while-timing", "in-check-stage"])
def test_crashing_hanging_and_wrong_candidates_are_isolated(tmp_path, registry, monkeypatch, jobs):
    monkeypatch.setenv("PAGED_MQA_LOGITS_EXTRA_BACKENDS", "fake_backends:BACKEND")
    untuned = tmp_path / "keys_untuned.csv"
    untuned.write_text("heads,head_dim,kv_block_size,preshuffle,batch,next_n,contexts\n16,128,16,0,1,2,32\n")
    out = str(tmp_path / "cpu_tuned.csv")
    outcome = tune(Options(untuned=[str(untuned)], out=out, backends=["torch", "fake"], jobs=jobs,
                           **dict(FAST, timeout=6)))
    status = {label: s for _, label, s in outcome.rejected}
    assert all(where.endswith("(check stage)") == (jobs == 1) for where, _, _ in outcome.rejected)
    assert status["fake[mode=wrong]"].startswith("FAIL: calc_diff")
    assert status["fake[mode=scribble]"] == "FAIL: positions outside the visible range were written"
    assert status["fake[mode=raise]"] == "ERROR: RuntimeError: fake backend: asked to raise"
    assert status["fake[mode=crash]"] == "ERROR: worker exited with code 17"
    assert status["fake[mode=hang]"].startswith("ERROR: timed out after 6 s (candidate; worker killed)")
    assert "fake[mode=ok]" not in status and outcome.restarts == 2
    # the run went on to the end and wrote a table a CPU can use (fake is not a table backend)
    assert {(r.context, r.backend) for r in table.parse_file(out)} == {(32, "torch"), (None, "torch")}


def test_recheck_reports_drift_and_regressions(tmp_path, capsys):
    tuned = str(tmp_path / "cpu_tuned.csv")
    rows = [old_row("cpu", 1, 32, us=1e-3), old_row("cpu", 1, None, us=None)]
    write_table(tuned, rows)
    baseline = str(tmp_path / "baseline.csv")
    write_table(baseline, [old_row("cpu", 1, 32, us=1e-3), old_row("cpu", 1, None, us=1e6)])
    report = str(tmp_path / "recheck.csv")
    rc = recheck(tuned, baseline=baseline, fail_on_regression=True, device="cpu", out=report, replays=1, quiet=True)
    text = capsys.readouterr().out
    assert rc == 1 and "1 FAIL" in text
    with open(report) as f:
        lines = f.read().splitlines()
    header, by_context = lines[0].split(","), {}
    for line in lines[1:]:
        cells = dict(zip(header, line.split(",")))
        by_context[cells["context"]] = cells
    assert by_context["32"]["drift"].startswith("DRIFT slower") and by_context["32"]["regression"].startswith("FAIL")
    assert by_context["any"]["drift"] == "no recorded us" and by_context["any"]["regression"] == "ok"
    assert all(c["status"] == "ok" and c["ran"] == "torch[]" for c in by_context.values())
    # without --fail-on-regression a regression is reported, not fatal; a report is a valid
    # baseline; --sample re-times a subset
    assert recheck(tuned, baseline=baseline, device="cpu", replays=1, quiet=True, sample=1) == 0
    assert "[recheck] 1 rows: 1 drifted beyond 10%, 0 WARN, 1 FAIL" in capsys.readouterr().out
    assert recheck(tuned, baseline=report, device="cpu", replays=1, quiet=True, sample=1) == 0


def test_contexts_too_large_for_the_free_memory_are_skipped_and_the_run_passes(tmp_path, capsys, monkeypatch):
    """A faked free-memory figure (inherited by the worker processes) that holds a 32-token
    context but not a 4096-token one: the key tuned at both contexts gets its rows at 32 (and an
    ``any`` row over the contexts that ran), the key tuned only at 4096 is reported as too large,
    neither is a failure, and the command line exits 0."""
    from paged_mqa_logits import bench
    from paged_mqa_logits.bench import workload
    from tuner import __main__ as tuner_cli

    small, = bench.grid_shapes([16], [1], [1], [32], [16])
    persistent, transient = workload._copy_footprint(small, small.lens(0))
    monkeypatch.setenv(workload.ENV_MEMORY_LIMIT, str(2 * (transient + 5 * persistent)))
    untuned = tmp_path / "keys_untuned.csv"
    untuned.write_text("heads,head_dim,kv_block_size,preshuffle,batch,next_n,contexts\n"
                       "16,128,16,0,1,1,32;4096\n"
                       "16,128,16,0,2,1,4096\n")
    out = tmp_path / "cpu_tuned.csv"
    rc = tuner_cli.main([str(untuned), "-o", str(out), "--backends", "torch", "--device", "cpu", "--top", "1",
                         "--screen-replays", "1", "--confirm-replays", "1", "--quiet"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    rows = table.parse_file(str(out))
    assert sorted((r.shape_key.batch, r.context or 0) for r in rows) == [(1, 0), (1, 32)]
    assert printed.count("context=4096: skipped: too large: ") == 2 and "GiB free (" in printed
    assert "1 key(s) tuned" in printed and "0 failed; 1 too large for the free memory" in printed
