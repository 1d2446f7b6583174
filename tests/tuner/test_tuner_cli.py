"""``python -m tuner`` fails like a tool (one stderr line, non-zero status, ``--debug`` for the
traceback), documents itself (``recheck``, defaults), needs no ``-o`` for ``--dry-run``, and
starts nothing once ``--time-budget`` is spent."""

import time

import pytest

from paged_mqa_logits.problem import ShapeKey, Target
from tuner import __main__ as cli
from tuner.candidates import Candidate
from tuner.keys import TuneKey
from tuner.search import KeyRun, Options, TimeStage

from paged_mqa_logits.cli import CliError

KEYS = "heads,head_dim,kv_block_size,preshuffle,batch,next_n\n64,128,64,0,32,2\n"


@pytest.fixture
def keys(tmp_path):
    path = tmp_path / "k.csv"
    path.write_text(KEYS)
    return str(path)


def run_main(capsys, *args):
    rc = cli.main(list(args))
    out, err = capsys.readouterr()
    return rc, out, [line for line in err.splitlines() if line.strip()]


def test_help_lists_recheck_and_shows_defaults(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert exit_.value.code == 0 and "recheck" in out and "(default: 180.0)" in out and "--debug" in out
    with pytest.raises(SystemExit):
        cli.main(["recheck", "--help"])
    assert "(default: 1.15)" in capsys.readouterr().out


def test_dry_run_needs_no_output_file(capsys, keys, tmp_path):
    rc, out, err = run_main(capsys, keys, "--dry-run", "--arch", "gfx950", "--backends", "torch", "--contexts", "64")
    assert rc == 0 and "1 key(s) to tune on gfx950/cu256" in out and not err


@pytest.mark.parametrize("args,needles", [
    (["frobnicate"], ["unknown command 'frobnicate'", "recheck"]),
    (["{keys}"], ["-o/--out", "--dry-run"]),
    (["missing.csv", "-o", "t.csv"], ["untuned", "missing.csv"]),
    (["{keys}", "--dry-run", "--backends", "nonesuch"], ["--backends", "nonesuch"]),
    (["{keys}", "-o", "t.csv", "--arch", "sm90"], ["--arch", "--dry-run"]),
    (["{keys}", "--dry-run", "--contexts", "8k"], ["--contexts", "8k"]),
    (["{keys}", "--dry-run", "--time-budget", "0"], ["--time-budget", "got 0"]),
    (["{keys}", "--dry-run", "--mp", "two"], ["--mp", "two"]),
    (["{keys}", "--dry-run", "--arch", "sm_80"], ["argument --arch: expected one of cpu, gfx942, gfx950, sm_90, got sm_80"]),
    (["{keys}", "--dry-run", "--arch", "sm90", "--cu-num", "0"], ["--cu-num", "got 0"]),
    (["{keys}", "--dry-run", "--confirm-replays", "-1"], ["--confirm-replays", "got -1"]),
    (["{keys}", "--dry-run", "--timeout", "0"], ["--timeout", "got 0"]),
    (["recheck", "--table", "t.csv", "--timeout", "-5"], ["--timeout", "got -5"]),
    (["recheck"], ["--table"]),
    (["recheck", "--table", "missing_tuned.csv"], ["missing_tuned.csv"]),
])
def test_errors_are_one_line(capsys, keys, args, needles):
    rc, _, err = run_main(capsys, *[a.format(keys=keys) for a in args])
    assert rc != 0 and len(err) == 1, err
    assert ": error: " in err[0] and all(n in err[0] for n in needles), err[0]


def test_bad_untuned_file_is_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("heads,batch\n64,1\n")
    rc, _, err = run_main(capsys, str(bad), "--dry-run")
    assert rc == 1 and len(err) == 1 and "bad.csv" in err[0] and "header lacks" in err[0]


def test_an_untuned_list_that_is_not_utf8_text_is_one_line_naming_the_file(capsys, tmp_path):
    binary = tmp_path / "binary_untuned.csv"
    binary.write_bytes(KEYS.encode() + b"\x80\x81,1\n")
    rc, _, err = run_main(capsys, str(binary), "--dry-run", "--arch", "sm_90")
    assert rc == 1 and len(err) == 1, err
    assert f"{binary}:3: not a text (UTF-8) CSV file" in err[0]


def test_debug_shows_the_traceback(keys):
    with pytest.raises(CliError, match="-o/--out"):
        cli.main([keys, "--debug"])
    with pytest.raises(ValueError, match="--backends"):
        cli.main([keys, "--dry-run", "--backends", "nonesuch", "--debug"])


def test_spent_budget_starts_nothing_not_even_a_started_keys_other_contexts(capsys):
    """Once the deadline passes, the timing stage hands out no task: neither the pending
    contexts of a key it already started nor a new key, and it says so once."""
    cands = [Candidate.of("torch", {})] * 2
    runs = [KeyRun(TuneKey(ShapeKey(heads=32, head_dim=128, kv_block_size=16, preshuffle=False, batch=b, next_n=1),
                           (64, 128, 256)), cands) for b in (1, 2)]

    class Bar:
        def update(self, n):
            pass

    stage = TimeStage(list(runs), Options(untuned=[], out="", top=1), Target("cpu", 0, "cpu"), "p", 1,
                      time.monotonic() + 1000, Bar(), lambda r: None)
    first = stage.next_task()
    assert first is not None and len(stage.pending) == 2  # key 1 started: two more contexts queued
    stage.deadline = time.monotonic() - 1
    assert stage.next_task() is None and stage.next_task() is None
    assert not stage.pending and not stage.queue
    assert [k.shape_key.batch for k in stage.left] == [1, 2]
    out = capsys.readouterr().out
    assert out.count("time budget spent") == 1 and "2 key(s) left untuned" in out


@pytest.mark.parametrize("lengths, ragged", [(None, ""), ("uniform", ""), ("wide", "wide")])
def test_lengths_option_reaches_the_timed_shapes(lengths, ragged):
    """``--lengths wide`` times every (key, context) on a batch whose lengths are drawn from
    [1, context] (the hint stays the context); the default times uniform batches."""
    argv = ["keys.csv", "-o", "t.csv"] + (["--lengths", lengths] if lengths else [])
    a = cli._tune_parser().parse_args(argv)
    assert a.lengths == (lengths or "uniform")
    opts = Options(untuned=[], out="", top=1, lengths="" if a.lengths == "uniform" else a.lengths)
    cands = [Candidate.of("torch", {})]
    key = TuneKey(ShapeKey(heads=32, head_dim=128, kv_block_size=16, preshuffle=False, batch=4, next_n=2), (64, 128))
    stage = TimeStage([KeyRun(key, cands)], opts, Target("cpu", 0, "cpu"),
                      "p", 1, None, type("Bar", (), {"update": lambda self, n: None})(), lambda r: None)
    first = stage.next_task()
    shapes = [first.shape] + [t.shape for t in stage.pending]
    assert [s.ragged for s in shapes] == [ragged, ragged]
    assert [s.context for s in shapes] == [64, 128]
    if ragged:
        assert max(shapes[0].lens()) == 64 and min(shapes[0].lens()) >= 1


def test_unknown_lengths_is_a_usage_error():
    with pytest.raises(CliError, match="argument --lengths: invalid choice: 'half'"):
        cli._tune_parser().parse_args(["keys.csv", "--lengths", "half"])


def test_a_run_that_tunes_nothing_exits_non_zero(capsys, keys, tmp_path, monkeypatch):
    """Every key's candidates fail (a time budget that ends before the first one, allowed here
    below the command line's minimum): exit 1 and a line saying nothing was tuned and that the
    budget ran out, the table untouched."""
    monkeypatch.setattr(cli, "MIN_TIME_BUDGET", 0.0)
    out = tmp_path / "t.csv"
    rc, _, err = run_main(capsys, keys, "-o", str(out), "--backends", "torch", "--contexts", "64", "--device", "cpu",
                          "--time-budget", "0.000001", "--quiet")
    assert rc == 1 and any("nothing tuned" in line and "time budget of 1e-06 s ran out" in line for line in err), err
    assert not out.exists()


def test_a_budget_below_the_minimum_is_refused_before_anything_starts(capsys, keys, tmp_path, monkeypatch):
    from tuner import search

    def no_run(opts):
        raise AssertionError("the run started")

    monkeypatch.setattr(search, "tune", no_run)
    out = tmp_path / "t.csv"
    rc, _, err = run_main(capsys, keys, "-o", str(out), "--device", "cpu", "--time-budget", "5")
    assert rc == 2 and len(err) == 1, err
    assert f"argument --time-budget: expected at least {search.MIN_TIME_BUDGET:.0f} s (nothing is written" in err[0]
    assert err[0].endswith("got 5")
    assert not out.exists()


def test_help_documents_the_exit_status(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "exit status: 0 every key tuned" in out and "2 a usage error" in out and "130 interrupted" in out
    assert f"at least {cli.MIN_TIME_BUDGET:.0f}" in out


def test_the_installed_entry_point_works_from_any_directory(tmp_path):
    """``python -m paged_mqa_logits.tuner`` needs no checkout as the working directory (``python
    -m tuner`` is the checkout's alias), and its help names the command it was run as."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "paged_mqa_logits.tuner", "--help"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m paged_mqa_logits.tuner ")
    assert "'python -m paged_mqa_logits.tuner recheck --table TABLE.csv'" in " ".join(done.stdout.split())
