"""The measuring method (paged_mqa_logits/bench/) on CPU: accounting, honest footprint, the
check on every shape, the timing loop, the CSV and the CLI's exit status. The CUDA-graph path
runs only with a GPU."""

import csv
import importlib.util
import math
import os
import sys

import pytest
import torch

from paged_mqa_logits.__main__ import main as run_cli
from paged_mqa_logits.backends import registry
from paged_mqa_logits.cli import USAGE_ERROR, CliError
from paged_mqa_logits import backends, bench
from paged_mqa_logits.bench import Impl, Schedule, Shape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "tuner"))

import fake_backends  # noqa: E402  (tests/tuner/fake_backends.py: candidates that misbehave on purpose)

TINY = Shape.of(heads=16, next_n=2, batch=2, context=48, kv_block_size=16)
#: DeepGEMM's timings on one H200 from an earlier run (a cross-run reference, never a same-run ratio)
ANCHOR_FILE = os.path.join(ROOT, "benchmarks", "h200", "deepgemm_anchor.csv")


@pytest.fixture
def fake_backend(monkeypatch):
    """Registers the misbehaving test backend for one test only."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY, fake="fake_backends:IN_PROCESS"))
    monkeypatch.setattr(registry, "_LOADED", dict(registry._LOADED, fake=fake_backends.IN_PROCESS))


def test_accounting_counts_visible_pairs_and_walked_tokens():
    shape = Shape.of(heads=32, next_n=3, batch=2, context=100, kv_block_size=16)
    acc = bench.accounting(shape, [100, 2], max_model_len=100, max_blocks=7)
    # rows of sequence 0 see 98, 99, 100 keys; sequence 1 (length 2) sees 0, 1, 2
    assert acc.visible == 98 + 99 + 100 + 0 + 1 + 2
    assert acc.kv_bytes == (100 + 2) * (128 + 4)
    assert acc.logits_bytes == 4 * acc.visible
    assert acc.flops(32, 128) == 2 * 32 * 128 * acc.visible
    # the visible width clamps at max_model_len and at the block table's width
    assert bench.accounting(shape, [100], max_model_len=50, max_blocks=7).visible == 150
    assert bench.accounting(shape, [100], max_model_len=200, max_blocks=2).visible == 96


def test_anchor_accounting_matches_deepgemm_file():
    """The anchor's GB/s is KV bytes + logits written, exactly what bench counts."""
    shape = Shape.of(heads=64, next_n=2, batch=8, context=8192)
    acc = bench.accounting(shape, shape.lens(), 8192, 128)
    with open(ANCHOR_FILE) as f:
        row = next(r for r in csv.DictReader(f)
                   if (r["H"], r["next_n"], r["batch"], r["context"]) == ("64", "2", "8", "8192"))
    assert acc.bytes / float(row["us"]) / 1e3 == pytest.approx(float(row["GBps"]), rel=0.01)


def test_workload_copies_are_distinct_blocks_from_a_permutation():
    shape = Shape.of(heads=16, next_n=1, batch=3, context=40, kv_block_size=16, ragged=True)
    wl = bench.build_workload(shape, "cpu", copies=3)
    assert wl.copies == 3 and wl.lens[0] == 40 and all(20 <= n <= 40 for n in wl.lens)
    pointers = {a.kv_cache.data_ptr() for a in wl.args} | {a.out.data_ptr() for a in wl.args}
    assert len(pointers) == 6  # nothing shared between copies
    for a, inp in zip(wl.args, wl.inputs):
        table = a.block_table
        used = torch.cat([table[b, : math.ceil(n / 16)] for b, n in enumerate(wl.lens)])
        assert sorted(used.tolist()) == list(range(a.num_blocks))  # a distinct block for every token group
        assert a.problem.context == 40  # the shape's context is passed as the host hint
    orders = {tuple(a.block_table[0, :3].tolist()) for a in wl.args}
    assert len(orders) > 1  # each copy has its own permutation
    assert wl.working_set_bytes == 3 * wl.accounting.bytes


def test_workload_with_another_hint_shares_the_copies():
    wl = bench.build_workload(TINY, "cpu", copies=2)
    ref = wl.reference()
    bare = wl.with_hint(None)
    assert [a.problem.context for a in bare.args] == [None, None] and [a.problem.context for a in wl.args] == [48, 48]
    assert bare.inputs is wl.inputs and bare.reference() is ref and wl.with_hint(48) is wl


def test_summary_compares_the_dispatch_with_each_implementation():
    shapes = [Shape.of(heads=64, next_n=1, batch=1, context=8192), Shape.of(heads=64, next_n=1, batch=8, context=8192)]
    ms = [bench.Measurement(s, Impl("dispatch"), us=us) for s, us in zip(shapes, (2.0, 3.0))]
    ms += [bench.Measurement(s, Impl.of("triton", {"ChunkK": 64}), us=us) for s, us in zip(shapes, (4.0, 3.0))]
    lines = bench.summary(ms, bench.load_anchor(ANCHOR_FILE))
    assert any(line.startswith("dispatch [uniform]: 2 shapes") and "(cross-run)" in line for line in lines)
    assert "dispatch vs triton[ChunkK=64] [uniform]: 1.414x faster (geomean over 2 shapes)" in lines


def test_summary_reports_same_run_deepgemm_per_grid_and_next_n_3():
    """Per length mode: geomean and worst shape vs DeepGEMM timed in the same run, flattened
    DeepGEMM (next_n 3) apart, the memory-bound bandwidth floor, next_n 3 vs its neighbours."""
    ms = []
    for ragged in ("", "wide"):
        for n, ours, theirs in ((1, 10.0, 11.0), (2, 20.0, 16.0), (3, 24.0, 60.0), (4, 30.0, 36.0)):
            s = Shape.of(heads=64, next_n=n, batch=128, context=32768, ragged=ragged)
            ms.append(bench.Measurement(s, Impl("dispatch"), us=ours, frac_of_copy_bw=0.8 + n / 100))
            ms.append(bench.Measurement(s, Impl("deepgemm"), us=theirs))
    lines = bench.summary(ms)
    uniform = next(line for line in lines if line.startswith("dispatch [uniform]"))
    wide = next(line for line in lines if line.startswith("dispatch [wide ragged [1, C]]"))
    expected_geomean = (11 / 10 * 16 / 20 * 36 / 30) ** (1 / 3)
    for line in (uniform, wide):
        assert f"vs DeepGEMM (same run) geomean {expected_geomean:.3f}x over 3 shapes" in line
        assert "worst 0.800x (H=64 next_n=2 batch=128" in line and "1 below 0.90x" in line
        assert "vs flattened DeepGEMM geomean 2.500x over 1 shapes" in line
        assert "min frac of copy bw (next_n<=2, B*ctx>=1M) 0.810" in line
        assert f"next_n 3 / mean(next_n 2, 4): worst {24 / 25:.3f}" in line and "0 of 1 above 1" in line
    assert "cross-run" not in uniform


def test_wide_ragged_lengths_are_seeded_and_span_one_to_context():
    shape = Shape.of(heads=16, next_n=1, batch=400, context=1000, ragged="wide")
    lens = shape.lens(seed=3)
    assert lens == shape.lens(seed=3) and lens != shape.lens(seed=4)
    assert lens[0] == 1000 and min(lens) >= 1 and max(lens) == 1000 and min(lens) < 100
    assert Shape.of(heads=16, next_n=1, batch=4, context=8, ragged=True).ragged == "half"
    with pytest.raises(ValueError, match="ragged"):
        Shape.of(heads=16, next_n=1, batch=4, context=8, ragged="sometimes")


def test_deepgemm_is_flattened_where_it_refuses_the_next_n():
    assert [bench.deepgemm_flattens(Shape.of(heads=64, next_n=n, batch=1, context=64)) for n in range(1, 9)] == \
        [False, False, True, False, True, True, True, True]


def test_time_calls_on_cpu_warms_up_then_loops():
    counter = []
    timing = bench.time_calls([lambda: counter.append(1)] * 2, torch.device("cpu"), Schedule(replays=3))
    assert len(counter) == 2 + 3 * 2 and timing.calls == 2 and timing.method == "wall" and timing.us > 0


def test_measure_torch_backend_with_the_same_accounting():
    wl = bench.build_workload(TINY, "cpu")
    m = bench.measure(Impl.of("torch"), wl, Schedule(replays=2), copy_gbps=10.0)
    assert m.ok and m.mask_ok is True and m.calc_diff < 1e-6
    assert m.us > 0 and m.rotate == 1 and m.timing == "wall"
    assert m.gbps == pytest.approx(wl.accounting.bytes / m.us / 1e3)
    assert m.tflops == pytest.approx(wl.accounting.flops(16, 128) / m.us / 1e6)
    assert m.frac_of_copy_bw == pytest.approx(m.gbps / 10.0)


def test_measure_dispatch_reports_what_it_chose_and_deepgemm_is_skipped_here():
    wl = bench.build_workload(TINY, "cpu")
    m = bench.measure(Impl("dispatch"), wl, Schedule(replays=1))
    assert m.ok and m.backend == "torch"
    d = bench.measure(Impl("deepgemm"), wl, Schedule(replays=1))
    assert d.status.startswith("skipped:") and not d.failed


@pytest.mark.parametrize("mode,status", [
    ("wrong", "FAIL: calc_diff"),
    ("scribble", "FAIL: positions outside the visible range were written"),
    ("raise", "ERROR: RuntimeError: fake backend: asked to raise"),
])
def test_measure_rejects_wrong_output_and_survives_exceptions(fake_backend, mode, status):
    wl = bench.build_workload(TINY, "cpu")
    m = bench.measure(Impl.of("fake", {"mode": mode}), wl, Schedule(replays=1))
    assert m.status.startswith(status) and m.failed and m.us is None


def test_check_uses_a_sentinel_so_untouched_means_untouched(fake_backend):
    wl = bench.build_workload(Shape.of(heads=16, next_n=1, batch=1, context=30, kv_block_size=16), "cpu")
    ok = bench.measure(Impl.of("fake", {"mode": "ok"}), wl, None)
    assert ok.ok and ok.us is None  # schedule=None: check only
    out = wl.args[0].out
    assert out[0, 30:].view(torch.int32).eq(bench.SENTINEL_BITS).all()


def test_anchor_speedup_only_on_the_anchor_layout():
    anchor = bench.load_anchor(ANCHOR_FILE)
    assert bench.load_anchor(None) == {}
    with pytest.raises(FileNotFoundError, match="--anchor"):
        bench.load_anchor(os.path.join(ROOT, "no_such_anchor.csv"))
    plain = Shape.of(heads=64, next_n=1, batch=1, context=8192)
    assert bench.anchor_us(anchor, plain) == pytest.approx(4.26)
    assert bench.anchor_us(anchor, Shape.of(heads=64, next_n=1, batch=1, context=8192, preshuffle=True)) is None
    assert bench.anchor_us(anchor, Shape.of(heads=64, next_n=1, batch=1, context=8192, lens_2d=False)) is None
    m = bench.Measurement(plain, Impl("dispatch"), backend="gluon", us=2.13)
    row = bench.csv_row(m, anchor, {plain: 4.0})
    assert row["speedup_vs_anchor_cross_run"] == "2" and row["speedup_vs_deepgemm"] == "1.878"


def test_shapes_from_an_untuned_csv(tmp_path):
    path = tmp_path / "keys.csv"
    path.write_text("# comment\nheads,head_dim,kv_block_size,preshuffle,batch,next_n,contexts\n32,128,16,1,4,2,64;128\n")
    shapes = bench.shapes_from_csv(str(path))
    assert ([(s.context, s.shape_key.preshuffle, s.shape_key.kv_block_size) for s in shapes]
            == [(64, True, 16), (128, True, 16)])
    assert [s.context for s in bench.shapes_from_csv(str(path), contexts=[32])] == [32]


def test_parse_knobs():
    assert bench.parse_knobs("ChunkK=128,variant=wgmma;SplitKV=0") == {"ChunkK": 128, "variant": "wgmma", "SplitKV": 0}
    with pytest.raises(ValueError, match="not NAME=VALUE"):
        bench.parse_knobs("ChunkK")


def _read(path):
    with open(path) as f:
        lines = f.read().splitlines()
    comments = [line for line in lines if line.startswith("#")]
    return comments, list(csv.DictReader(line for line in lines if not line.startswith("#")))


def test_cli_writes_csv_headed_by_the_environment(tmp_path, capsys):
    out = tmp_path / "bench.csv"
    rc = bench.main(["--heads", "16", "--next-n", "1,2", "--batch", "1", "--context", "32", "--kv-block-size", "16",
                     "--backend", "torch", "--dispatch", "--deepgemm", "--replays", "1", "--quiet", "--out", str(out)])
    assert rc == 0
    comments, rows = _read(out)
    text = "\n".join(comments)
    for field in ("# gpu: ", "# versions: triton ", "torch ", "# date: ", "# copy_bandwidth_GBps: ", "# command: "):
        assert field in text
    assert [(r["impl"], r["next_n"]) for r in rows] == [
        ("dispatch", "1"), ("backend", "1"), ("deepgemm", "1"), ("dispatch", "2"), ("backend", "2"), ("deepgemm", "2")]
    assert set(bench.COLUMNS) <= set(rows[0])
    timed = [r for r in rows if r["impl"] != "deepgemm"]
    assert all(r["status"] == "ok" and float(r["us"]) > 0 and r["mask_ok"] == "1" for r in timed)
    assert all(r["status"].startswith("skipped") for r in rows if r["impl"] == "deepgemm")
    assert "dispatch" in capsys.readouterr().out


def test_cli_fails_loudly_on_a_wrong_backend(tmp_path, fake_backend):
    out = tmp_path / "bench.csv"
    rc = bench.main(["--heads", "16", "--next-n", "1", "--batch", "1", "--context", "32", "--kv-block-size", "16",
                     "--backend", "fake", "--config", "mode=wrong", "--device", "cpu", "--quiet", "--out", str(out)])
    assert rc == 1
    _, rows = _read(out)
    assert rows[0]["status"].startswith("FAIL: calc_diff") and rows[0]["knobs"] == "mode=wrong"


def test_cli_all_candidates_from_a_shapes_file(tmp_path, fake_backend):
    keys = tmp_path / "keys.csv"
    keys.write_text("heads,next_n,batch,context,kv_block_size\n16,1,1,32,16\n")
    out = tmp_path / "bench.csv"
    rc = bench.main(["--shapes", str(keys), "--backend", "fake", "--all-candidates", "--device", "cpu", "--quiet",
                     "--out", str(out)])
    _, rows = _read(out)
    assert rc == 1  # some candidates are wrong on purpose
    assert [(r["knobs"], r["status"][:5]) for r in rows] == [
        ("mode=ok", "ok"), ("mode=wrong", "FAIL:"), ("mode=scribble", "FAIL:"), ("mode=raise", "ERROR")]


def test_cli_config_narrows_all_candidates(tmp_path, fake_backend):
    """``--all-candidates --config K=V`` times only the candidates with those knob values."""
    out = tmp_path / "bench.csv"
    rc = bench.main(["--heads", "16", "--next-n", "1", "--batch", "1", "--context", "32", "--kv-block-size", "16",
                     "--backend", "fake", "--all-candidates", "--config", "mode=ok", "--dispatch", "--device", "cpu",
                     "--quiet", "--out", str(out)])
    _, rows = _read(out)
    assert rc == 0
    assert [(r["impl"], r["knobs"]) for r in rows if r["impl"] == "backend"] == [("backend", "mode=ok")]
    assert [r["impl"] for r in rows] == ["dispatch", "backend"]


def test_host_overhead_benchmark_runs(monkeypatch, capsys):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_LOADED", dict(registry._LOADED))
    spec = importlib.util.spec_from_file_location("host_overhead", os.path.join(ROOT, "tools", "host_overhead.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.main(["--iters", "3", "--repeats", "1", "--context", "64", "--kv-block-size", "16", "--heads", "16"])
    assert len(rows) == 5 and all(us > 0 for _, us in rows)
    assert "backend='noop'" in capsys.readouterr().out


def test_graph_timing_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA/ROCm GPU: CUDA-graph replay timing")
    shape = Shape.of(heads=32, next_n=2, batch=4, context=2048)
    wl = bench.build_workload(shape, "cuda", max_copies=8)
    assert wl.copies == 8  # capped; the working set target is far larger than this shape
    m = bench.measure(Impl.of("triton"), wl, Schedule(replays=3), copy_gbps=bench.copy_bandwidth("cuda"))
    assert m.ok, m.status
    assert m.timing == "graph" and m.calls % wl.copies == 0 and 0 < m.frac_of_copy_bw < 1.5


class _ScriptedEvent:
    """A stand-in for a CUDA event: records into a shared log; elapsed times are scripted."""

    def __init__(self, log, elapsed_ms):
        self.log, self.elapsed_ms = log, elapsed_ms

    def record(self):
        self.log.append("event")

    def elapsed_time(self, end):
        return self.elapsed_ms.pop(0)


def test_cold_samples_flush_before_each_call_and_time_it_alone():
    from paged_mqa_logits.bench.measure import cold_samples

    log, elapsed = [], [0.004, 0.006, 0.010, 0.020]  # ms: replay 1 calls a, b; replay 2 calls a, b
    runs = [lambda: log.append("a"), lambda: log.append("b")]
    samples = cold_samples(runs, lambda: log.append("flush"), lambda: _ScriptedEvent(log, elapsed),
                           lambda: log.append("sync"), replays=2)
    # the flush is outside each call's pair of events, and every call has its own pair
    per_replay = ["flush", "event", "a", "event", "flush", "event", "b", "event", "sync"]
    assert log == per_replay * 2
    assert samples == pytest.approx([5.0, 15.0])  # the mean call of each replay, in microseconds


def test_cold_l2_needs_a_gpu(capsys):
    with pytest.raises(CliError, match="argument --cold-l2: flushes a GPU's L2 between calls; --device is cpu"):
        bench.main(["--cold-l2", "--device", "cpu", "--quiet", "--backend", "torch"])


def test_cold_l2_timing_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA/ROCm GPU: the L2 flush and events")
    shape = Shape.of(heads=32, next_n=2, batch=4, context=2048)
    wl = bench.build_workload(shape, "cuda", max_copies=2)
    m = bench.measure(Impl.of("triton"), wl, Schedule(replays=3, cold_l2=True))
    assert m.ok, m.status
    assert m.timing == "cold-l2" and m.calls == wl.copies and m.us > 0


def test_cli_wide_ragged_grid_marks_its_rows_and_summarises_them(tmp_path, capsys):
    out = tmp_path / "bench.csv"
    rc = bench.main(["--heads", "16", "--next-n", "1", "--batch", "5", "--context", "64", "--kv-block-size", "16",
                     "--backend", "torch", "--wide-ragged", "--replays", "1", "--quiet", "--out", str(out)])
    assert rc == 0
    _, rows = _read(out)
    assert [r["ragged"] for r in rows] == ["wide"]
    assert "torch[default] [wide ragged [1, C]]: 1 shapes" in capsys.readouterr().out
    with pytest.raises(CliError, match="not allowed with argument"):  # the two ragged modes exclude each other
        bench.main(["--ragged", "--wide-ragged", "--device", "cpu"])


@pytest.mark.parametrize("argv, named", [(["--batch", "x"], "--batch"), (["--context", "0"], "--context"),
                                         (["--backend", "nosuch"], "--backend")])
def test_cli_rejects_bad_options_naming_them(argv, named, capsys):
    """The bench's parser is the shared one: a usage error is a ``CliError`` naming the option,
    and the command line prints it as one line with exit status 2."""
    with pytest.raises(CliError, match=f"argument {named}"):
        bench.main(argv + ["--device", "cpu", "--quiet"])
    assert run_cli(["bench", *argv, "--device", "cpu", "--quiet"]) == USAGE_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"argument {named}" in err[0] and err[0].startswith("python -m paged_mqa_logits bench")


# ----------------------------------------------------------------------------- formats
def test_accounting_counts_fp4_cache_bytes_and_bf16_logits():
    fp4 = Shape.of(heads=32, next_n=3, batch=2, context=100, kv_block_size=16, kv_format="fp4", logits_dtype="bf16")
    acc = bench.accounting(fp4, [100, 2], max_model_len=100, max_blocks=7)
    assert acc.kv_bytes == (100 + 2) * 68  # 64 packed key bytes + 4 exponent bytes a token
    assert acc.logits_bytes == 2 * acc.visible
    assert acc.flops(32, 128) == 2 * 32 * 128 * acc.visible  # the same multiply-adds as fp8


def test_workload_and_check_of_an_fp4_bf16_shape():
    shape = Shape.of(heads=16, next_n=2, batch=2, context=40, kv_block_size=16, kv_format="fp4", logits_dtype="bf16")
    wl = bench.build_workload(shape, "cpu")
    args = wl.args[0]
    key = args.problem.shape_key
    assert (key.kv_format, key.logits_dtype) == ("fp4", "bf16") and args.out.dtype == torch.bfloat16
    assert wl.reference().dtype == torch.bfloat16
    m = bench.measure(Impl.of("triton"), wl, Schedule(replays=1))
    assert m.ok and m.calc_diff < 5e-6 and m.mask_ok, m.status
    assert args.out[0, 40:].view(torch.int16).eq(bench.SENTINEL_BITS_BF16).all()  # past the row: the sentinel


def test_cli_kv_format_and_logits_dtype_reach_the_csv(tmp_path):
    out = tmp_path / "bench.csv"
    rc = bench.main(["--heads", "16", "--next-n", "2", "--batch", "1", "--context", "32", "--kv-block-size", "16",
                     "--kv-format", "fp4", "--logits-dtype", "bf16", "--backend", "torch", "--replays", "1",
                     "--device", "cpu", "--quiet", "--out", str(out)])
    assert rc == 0
    comments, rows = _read(out)
    assert [(r["kv_format"], r["logits_dtype"], r["status"]) for r in rows] == [("fp4", "bf16", "ok")]
    assert float(rows[0]["GBps"]) * float(rows[0]["us"]) * 1e3 == pytest.approx(32 * 68 + (31 + 32) * 2, rel=0.02)


def test_shapes_file_format_columns_and_their_override(tmp_path):
    path = tmp_path / "keys.csv"
    path.write_text("heads,head_dim,kv_block_size,preshuffle,batch,next_n,kv_format,contexts\n32,128,16,1,4,2,fp4,64\n")
    assert [s.shape_key.kv_format for s in bench.shapes_from_csv(str(path))] == ["fp4"]
    overridden = bench.shapes_from_csv(str(path), kv_format="fp8", logits_dtype="bf16")
    assert [(s.shape_key.kv_format, s.shape_key.logits_dtype) for s in overridden] == [("fp8", "bf16")]


def test_deepgemm_has_no_fp4_peer_on_sm_90():
    from paged_mqa_logits.bench.deepgemm import deepgemm_unsupported

    fp4 = Shape.of(heads=64, next_n=1, batch=8, context=8192, kv_format="fp4")
    assert deepgemm_unsupported(fp4, "sm_90") == ("DeepGEMM serves MXFP4 on sm_100/sm_120 only: fp4 has no DeepGEMM "
                                                  "peer on sm_90")
    assert "fp4" not in (deepgemm_unsupported(Shape.of(heads=64, next_n=1, batch=8, context=8192,
                                                       logits_dtype="bf16"), "sm_90") or "")


def test_the_gpu_grid_covers_both_block_sizes_and_a_batch_far_past_l2():
    """The published comparison's default grid: 64- and 32-token blocks, and batch 4096 (a cache
    of about 18 GB at 32k); the CPU grid stays small. Asking for a GPU grid builds nothing."""
    from paged_mqa_logits.bench.cli import parser, resolve_shapes
    p = parser()
    gpu_shapes, defaults = resolve_shapes(p, p.parse_args([]), torch.device("cuda"))
    assert "kv_block_size" in defaults and "batch" in defaults
    assert len(gpu_shapes) == 2 * 4 * 7 * 2 * 2
    assert {s.shape_key.kv_block_size for s in gpu_shapes} == {32, 64}
    big = [s for s in gpu_shapes if s.shape_key.batch == 4096 and s.context == 32768 and s.shape_key.heads == 64]
    assert big and all(s.shape_key.batch * s.context * 132 > 17e9 for s in big)
    cpu_shapes, _ = resolve_shapes(p, p.parse_args([]), torch.device("cpu"))
    assert len(cpu_shapes) == 8 and {s.shape_key.kv_block_size for s in cpu_shapes} == {64}


def test_a_shape_too_large_for_the_free_memory_is_skipped_and_the_run_passes(tmp_path, capsys, monkeypatch):
    """A faked free-memory figure that holds the small shape's inputs but not the large one's: the
    large one is reported as skipped with the bytes it needs and the bytes free, the small one is
    timed, and the run exits 0."""
    from paged_mqa_logits.bench import workload

    small, = bench.grid_shapes([16], [1], [1], [32], [16])
    persistent, transient = workload._copy_footprint(small, small.lens(0))
    limit = 2 * (transient + 5 * persistent)  # the 32-token shape fits, the 4096-token one does not
    monkeypatch.setenv(workload.ENV_MEMORY_LIMIT, str(limit))
    assert workload.free_memory(torch.device("cpu")) == limit
    out = tmp_path / "bench.csv"
    rc = bench.main(["--heads", "16", "--next-n", "1", "--batch", "1", "--context", "32,4096", "--kv-block-size", "16",
                     "--backend", "torch", "--replays", "1", "--device", "cpu", "--quiet", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    _, rows = _read(out)
    by_context = {r["context"]: r["status"] for r in rows}
    assert by_context["32"] == "ok"
    assert by_context["4096"].startswith("skipped: too large: ") and f"GiB free ({limit} bytes)" in by_context["4096"]
    needed = int(by_context["4096"].split("GiB free (")[1].split(" bytes")[0])
    assert needed > limit
    assert "# skipped 1 shape(s) whose inputs do not fit" in captured.out
    assert "FAILED" not in captured.err


def test_a_memory_limit_that_is_no_byte_count_names_the_variable(monkeypatch):
    from paged_mqa_logits.bench import workload
    from paged_mqa_logits.errors import PagedMQAEnvironmentError

    monkeypatch.setenv(workload.ENV_MEMORY_LIMIT, "8GiB")
    with pytest.raises(PagedMQAEnvironmentError, match="PAGED_MQA_LOGITS_MEMORY_LIMIT: expected a positive number "
                                                       "of bytes, got '8GiB'"):
        workload.free_memory(torch.device("cpu"))
