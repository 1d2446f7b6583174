"""``--op topk`` end to end on CPU: tiny rows through the Triton interpreter, checked against
torch.topk before timing, rows written with provenance and read back by the op's dispatch; a
wrong candidate is rejected, a key with no survivor writes nothing, bad input names its column."""

import pytest
import torch

from paged_mqa_logits import reload_tuned_table, table, topk
from paged_mqa_logits.problem import TopkKey
from paged_mqa_logits.top_k import backends
from tuner import Options, tune
from tuner.__main__ import main as tuner_main
from tuner.topk import read_untuned

FAST = dict(device="cpu", top=1, screen_replays=1, confirm_replays=1, quiet=True, op="topk")


def untuned(tmp_path, text="rows,k,contexts\n2,8,64;128\n"):
    path = tmp_path / "keys_untuned.csv"
    path.write_text(text)
    return str(path)


def test_tune_topk_writes_rows_the_op_dispatches_to(tmp_path, monkeypatch):
    out = str(tmp_path / "cpu_topk_tuned.csv")
    report = str(tmp_path / "report.csv")
    outcome = tune(Options(untuned=[untuned(tmp_path)], out=out, backends=["triton", "triton_radix",
                                                                               "triton_sample"],
                           report=report, **FAST))
    assert len(outcome.tuned) == 1 and not outcome.failed and not outcome.rejected
    rows = table.parse_file(out)
    assert sorted((r.op, r.shape_key, r.context or 0) for r in rows) == \
        [("topk", TopkKey(rows=2, k=8), c) for c in (0, 64, 128)]
    assert all(r.backend in ("triton", "triton_radix", "triton_sample") and r.us > 0 and "BLOCK" in r.knobs
               for r in rows)
    assert all(r.provenance.startswith("tuned:cpu|cu0|triton") for r in rows)
    assert open(out).read().count("\narch,cu_num,op,rows,k,logits_dtype,context,backend,") == 1
    text = open(report).read()
    assert ",screen,triton," in text and ",screen,triton_radix," in text and ",screen,triton_sample," in text
    assert ",confirm," in text

    monkeypatch.setenv(table.ENV_CONFIGS, out)
    reload_tuned_table()
    try:
        logits, lens = torch.randn(2, 100), torch.tensor([100, 70], dtype=torch.int32)
        got = topk(logits, lens, 8)
        choice = backends.decisions()[("cpu", 0, TopkKey(rows=2, k=8), 100)]
        assert choice.source.startswith(out) and choice.backend in ("triton", "triton_radix", "triton_sample")
        assert torch.equal(got.sort(1).values, topk(logits, lens, 8, backend="torch").sort(1).values)
        # resume: the key is in the table, nothing is run
        again = tune(Options(untuned=[untuned(tmp_path)], out=out, backends=["triton"], **FAST))
        assert again.skipped and not again.tuned
    finally:
        monkeypatch.delenv(table.ENV_CONFIGS)
        reload_tuned_table()


def test_a_wrong_candidate_is_rejected_and_nothing_written_without_survivors(tmp_path, monkeypatch):
    from paged_mqa_logits.top_k import torch_ref

    def wrong(call, knobs=None):
        call.out.copy_(torch.arange(call.k, dtype=torch.int32).expand(call.rows, call.k))  # the first k, not the top

    monkeypatch.setattr(torch_ref, "launch", wrong)
    out = tmp_path / "cpu_topk_tuned.csv"
    out.write_text("arch,cu_num,op,rows,k,context,backend,us,provenance\ncpu,0,topk,9,8,64,torch,1.0,tuned:old\n")
    before = out.read_text()
    outcome = tune(Options(untuned=[untuned(tmp_path, "rows,k,contexts\n2,8,64\n")], out=str(out),
                           backends=["torch"], **FAST))
    assert outcome.failed and not outcome.tuned
    assert outcome.rejected[0][2] == "FAIL: not the exact top-k (as a set)"
    assert out.read_text() == before  # nothing written

    outcome = tune(Options(untuned=[untuned(tmp_path, "rows,k,contexts\n2,8,64\n")], out=str(out),
                           backends=["torch", "triton"], **FAST))
    assert outcome.tuned and {r.backend for r in outcome.rows} == {"triton"}
    assert {r.shape_key.rows for r in table.parse_file(str(out))} == {2, 9}  # the other key is kept


@pytest.mark.parametrize("text,message", [
    ("rows,contexts\n2,64\n", "header lacks column(s) k"),
    ("rows,k\n0,8\n", ":2: column rows must be >= 1, got 0"),
    ("rows,k\n2,5000\n", ":2: column k must be <= 4096, got 5000"),
    ("rows,k,logits_dtype\n2,8,fp16\n", ":2: column logits_dtype must be one of fp32, bf16, got 'fp16'"),
])
def test_bad_untuned_lists_name_line_and_column(tmp_path, text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_untuned([untuned(tmp_path, text)])


def test_cli_errors_and_dry_run(tmp_path, capsys):
    keys = untuned(tmp_path)
    assert tuner_main(["--op", "topk", keys, "-o", str(tmp_path / "t.csv"), "--backends", "gluon"]) == 1
    assert ("argument --backends: expected top-k backends among torch, triton, triton_radix, triton_sample, got "
            "unknown gluon") in capsys.readouterr().err
    assert not (tmp_path / "t.csv").exists()
    assert tuner_main(["--op", "sort", keys]) == 2
    assert tuner_main(["--op", "topk", "topk_untuned.csv", "--dry-run", "--arch", "gfx950"]) == 0
    out = capsys.readouterr().out
    assert "topk rows=1024 k=2048 contexts=8192,32768,131072" in out and "triton_radix[BLOCK=1024;num_warps=8]" in out
    assert "triton_sample[BLOCK=8192;num_warps=8]" in out
    assert "6 top-k key(s) to tune on gfx950/cu256" in out


class _Clock:
    """``tuner.topk``'s clock, moved by the test: ``monotonic`` is what the budget reads."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now

    @staticmethod
    def perf_counter():
        import time

        return time.perf_counter()


def test_time_budget_leaves_the_keys_it_did_not_finish(tmp_path, monkeypatch, capsys):
    """Spent after the first key: the second is left untuned (nothing of it written), and said so."""
    import tuner.topk as topk_tuner

    clock = _Clock()
    monkeypatch.setattr(topk_tuner, "time", clock)
    write_key = topk_tuner._write_key

    def write_then_spend(*args):
        write_key(*args)
        clock.now = 61.0

    monkeypatch.setattr(topk_tuner, "_write_key", write_then_spend)
    out = tmp_path / "cpu_topk_tuned.csv"
    outcome = tune(Options(untuned=[untuned(tmp_path, "rows,k,contexts\n2,8,64\n4,8,64\n")], out=str(out),
                           backends=["triton"], time_budget=60.0, **FAST))
    assert [k.shape_key.rows for k in outcome.tuned] == [2] and [k.shape_key.rows for k in outcome.left] == [4]
    assert {r.shape_key.rows for r in table.parse_file(str(out))} == {2}
    assert "time budget spent: no further candidates started; 1 key(s) left untuned" in capsys.readouterr().out


def test_time_budget_stops_a_started_context_after_the_grace(tmp_path, monkeypatch):
    """Past the budget and its grace inside a context: no further candidate starts, the key is left
    untuned and the table is not created."""
    import tuner.topk as topk_tuner

    clock = _Clock()
    monkeypatch.setattr(topk_tuner, "time", clock)
    checked = topk_tuner.selection_matches

    def check_then_spend(*args):
        clock.now = 60.0 + topk_tuner.grace_seconds(60.0)
        return checked(*args)

    monkeypatch.setattr(topk_tuner, "selection_matches", check_then_spend)
    out = tmp_path / "cpu_topk_tuned.csv"
    outcome = tune(Options(untuned=[untuned(tmp_path, "rows,k,contexts\n2,8,64\n")], out=str(out),
                           backends=["triton"], time_budget=60.0, **FAST))
    assert not outcome.tuned and [k.shape_key.rows for k in outcome.left] == [2]
    assert not out.exists()


def test_progress_bar_counts_the_timings(tmp_path, capsys):
    tune(Options(untuned=[untuned(tmp_path, "rows,k,contexts\n2,8,64;128\n")], out=str(tmp_path / "t.csv"),
                 backends=["triton"], **dict(FAST, quiet=False)))
    err = capsys.readouterr().err
    from paged_mqa_logits.top_k import knobs

    timings = 2 * len(knobs.candidates("triton", True, 2, 64, 0))
    assert f"{timings}/{timings}" in err and "timing" in err


def test_time_budget_spent_between_the_contexts_of_a_key(tmp_path, monkeypatch):
    """Spent after a key's first width: its second is not started, the key is left untuned."""
    import tuner.topk as topk_tuner

    clock = _Clock()
    monkeypatch.setattr(topk_tuner, "time", clock)
    timed = topk_tuner.time_context
    widths = []

    def time_then_spend(key, context, *args, **kwargs):
        widths.append(context)
        result = timed(key, context, *args, **kwargs)
        clock.now = 61.0
        return result

    monkeypatch.setattr(topk_tuner, "time_context", time_then_spend)
    out = tmp_path / "cpu_topk_tuned.csv"
    outcome = tune(Options(untuned=[untuned(tmp_path)], out=str(out), backends=["triton"], time_budget=60.0, **FAST))
    assert widths == [64] and not outcome.tuned and [k.shape_key.rows for k in outcome.left] == [2]
    assert not out.exists()


def test_progress_bar_counts_failed_candidates_too(tmp_path, monkeypatch, capsys):
    from paged_mqa_logits.top_k import torch_ref

    monkeypatch.setattr(torch_ref, "launch", lambda call, knobs=None: call.out.fill_(0))  # never the top k
    tune(Options(untuned=[untuned(tmp_path, "rows,k,contexts\n2,8,64\n")], out=str(tmp_path / "t.csv"),
                 backends=["torch"], **dict(FAST, quiet=False)))
    assert "1/1" in capsys.readouterr().err
