"""``bench --indexer`` on CPU: the run end to end (CSV header and columns, the step's checks), the
peers' rows skipped with the reason when DeepGEMM or vLLM are absent, the engines' pair with stand-ins
for both, a wrong selection caught, and the option errors."""

from __future__ import annotations

import csv
import importlib

import pytest
import torch

from paged_mqa_logits import paged_mqa_logits as logits_op, topk
from paged_mqa_logits.bench import cli, indexer as bench
from paged_mqa_logits.cli import CliError
from paged_mqa_logits.compat import vllm as vllm_compat

#: the module (the package's ``measure`` is its function)
measure = importlib.import_module("paged_mqa_logits.bench.measure")
TINY = ["--device", "cpu", "--heads", "16", "--next-n", "2", "--batch", "2", "--context", "48", "--k", "8",
        "--kv-block-size", "16", "--replays", "1"]


def read(path) -> tuple[list[str], list[dict]]:
    text = path.read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    rows = list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))
    return header, rows


def test_cpu_run_writes_the_csv_and_skips_absent_peers(tmp_path):
    path = tmp_path / "indexer.csv"
    rc = cli.main(["--indexer", *TINY, "--deepgemm", "--vllm", str(tmp_path / "no_vllm"), "--out", str(path)])
    assert rc == 0
    header, rows = read(path)
    assert any(line.startswith("# versions: triton") for line in header)
    assert any(line.startswith("# copy_bandwidth_GBps") for line in header)
    assert any(line.startswith("# method: docs/TOPK.md") for line in header)
    assert list(rows[0]) == bench.COLUMNS
    assert [r["impl"] for r in rows] == ["ours_logits", "ours_step", "deepgemm_logits", "deepgemm+vllm"] * 2
    assert {r["lengths"] for r in rows} == {"uniform", "wide"}
    for r in rows:
        if r["impl"].startswith("ours"):
            assert r["status"] == "ok" and float(r["us"]) > 0 and float(r["GBps"]) > 0 and r["timing"] == "wall"
            assert float(r["calc_diff"]) < 1e-3
        else:
            assert r["status"].startswith("skipped: ") and "sm_90" in r["status"]
    steps = [r for r in rows if r["impl"] == "ours_step"]
    assert all(r["exact"] == "1" and float(r["step_over_logits"]) > 0 and r["backend"] == "torch+torch" for r in steps)
    engines = [r for r in rows if r["impl"] == "deepgemm+vllm"]
    assert all("not importable" in r["status"] for r in engines)


class StagedVllm:
    """Stands in for vLLM's staged module: its two kernels' arguments, served by this package's top-k."""

    signatures = {"persistent_topk": ("logits", "lengths", "output", "workspace", "k")}

    def top_k_per_row_decode(self, x, next_n, lens, out, rows, stride0, stride1, k):
        vllm_compat.top_k_per_row_decode(x, next_n, lens, out, rows, stride0, stride1, k)

    def persistent_topk(self, x, row_lens, out, workspace, k):
        topk(x, row_lens[:, None].contiguous(), k, out=out)


def deepgemm_stand_in(workload):
    """DeepGEMM's calls as the bench makes them: each returns fresh ``[rows, max_model_len]`` logits."""
    def call(inp):
        def run():
            out = torch.full((inp["q_fp8"].shape[0] * inp["q_fp8"].shape[1], inp["max_model_len"]), float("-inf"))
            logits_op(inp["q_fp8"], inp["kv_cache"], inp["weights"], out, inp["context_lens"], inp["kv_indices"],
                      inp["max_model_len"], KVBlockSize=inp["kv_block_size"])
            return out
        return run
    return [call(inp) for inp in workload.inputs]


def test_engines_pair_times_the_faster_vllm_kernel(tmp_path, monkeypatch):
    for module in (bench, measure):
        monkeypatch.setattr(module, "deepgemm_unsupported", lambda shape, arch: None)
        monkeypatch.setattr(module, "deepgemm_calls", deepgemm_stand_in)
    monkeypatch.setattr(bench, "load_vllm", lambda path: StagedVllm())
    path = tmp_path / "indexer.csv"
    rc = bench.main([*TINY, "--lengths", "wide", "--deepgemm", "--vllm", "staged", "--out", str(path)])
    assert rc == 0
    rows = {r["impl"]: r for r in read(path)[1]}
    pair = rows["deepgemm+vllm"]
    assert pair["status"] == "ok" and pair["exact"] == "1"
    assert pair["backend"] in ("deepgemm+vllm:top_k_per_row_decode", "deepgemm+vllm:persistent_topk")
    assert rows["deepgemm_logits"]["status"] == "ok"
    step = rows["ours_step"]
    assert float(step["speedup_vs_engines"]) == pytest.approx(float(pair["us"]) / float(step["us"]), rel=1e-2)
    assert float(pair["step_over_logits"]) == pytest.approx(
        float(pair["us"]) / float(rows["deepgemm_logits"]["us"]), rel=1e-2)


def test_a_wrong_selection_fails_the_run(tmp_path, monkeypatch):
    real = bench.indexer_topk

    def wrong(*args, **kwargs):
        out = real(*args, **kwargs)
        out.fill_(0)  # position 0 everywhere: not distinct, not the top
        return out

    monkeypatch.setattr(bench, "indexer_topk", wrong)
    path = tmp_path / "indexer.csv"
    assert bench.main([*TINY, "--lengths", "uniform", "--out", str(path)]) == 1
    step = {r["impl"]: r for r in read(path)[1]}["ours_step"]
    assert step["exact"] == "0" and step["status"] == "FAIL: not the exact top-k" and not step["us"]


def test_ratios_and_summary():
    rows = {impl: {"impl": impl, "lengths": "uniform", "us": us} for impl, us in
            (("ours_logits", 10.0), ("ours_step", 12.0), ("deepgemm_logits", 9.0), ("deepgemm+vllm", 18.0))}
    bench.ratios(rows)
    assert rows["ours_step"]["speedup_vs_engines"] == 1.5 and rows["ours_step"]["step_over_logits"] == 1.2
    assert rows["deepgemm+vllm"]["step_over_logits"] == 2.0
    lines = bench.summary(list(rows.values()))
    assert lines[0].startswith("DeepGEMM+vLLM time / ours_step time [uniform]: geomean 1.500 over 1 shapes")


@pytest.mark.parametrize("argv, option", [
    (["--vllm", "dir"], "--vllm"),
    (["--k", "5000"], "--k"),
    (["--k", "8,16"], "--k"),
    (["--lengths", "half"], "--lengths"),
    (["--heads", "10"], "--heads"),
    (["--batch", "0"], "--batch"),
    (["--topk-backend", "cuda"], "--topk-backend"),
])
def test_option_errors(argv, option):
    with pytest.raises((CliError, SystemExit)) as error:
        bench.main(argv)
    assert option in str(error.value)
