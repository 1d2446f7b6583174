"""The CPU-checkable parts of ``bench --topk``: lengths, byte accounting, the exactness check
(which must catch a wrong selection), the CSV and the option errors."""

from __future__ import annotations

import csv
import json
import sys

import pytest
import torch

from paged_mqa_logits.bench import topk as bench
from paged_mqa_logits.cli import CliError
from paged_mqa_logits.top_k import topk


def test_lengths_and_bytes():
    g = torch.Generator().manual_seed(0)
    uniform = bench.RowShape(4, 2, 100, "uniform", 16)
    lens = bench.sequence_lengths(uniform, g)
    assert lens.tolist() == [100] * 4
    # rows see 99 and 100 positions: 4 bytes each, plus 16 slots of 4 bytes per row
    assert bench.useful_bytes(uniform, lens) == 4 * 4 * (99 + 100) + 4 * 8 * 16
    wide = bench.sequence_lengths(bench.RowShape(64, 1, 100, "wide", 16), g)
    assert wide[0] == 100 and int(wide.min()) >= 1 and int(wide.max()) <= 100 and len(set(wide.tolist())) > 10


def test_selection_check_catches_a_wrong_answer():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 50, generator=g)
    lens = torch.tensor([50, 10], dtype=torch.int32)
    row_lens = torch.tensor([49, 50, 9, 10], dtype=torch.int32)
    out = topk(logits, lens, 16, next_n=2)
    assert bench.selection_matches(out, logits, row_lens, 16)
    wrong = out.clone()
    wrong[0, 0] = int(logits[0, :49].argmin())
    assert not bench.selection_matches(wrong, logits, row_lens, 16)
    short = out.clone()
    short[2, 8] = -1  # row 2 sees 9 positions: one dropped
    assert not bench.selection_matches(short, logits, row_lens, 16)
    tied = torch.zeros(1, 8)
    picked = topk(tied, torch.tensor([8], dtype=torch.int32), 4)
    assert bench.selection_matches(picked, tied, torch.tensor([8], dtype=torch.int32), 4)
    twice = picked.clone()
    twice[0, 1] = twice[0, 0]  # the same position twice: equal values, still wrong
    assert not bench.selection_matches(twice, tied, torch.tensor([8], dtype=torch.int32), 4)
    hidden = picked.clone()
    hidden[0, 0] = 7  # row sees 6: position 7 is not visible (same value)
    assert not bench.selection_matches(hidden, tied, torch.tensor([6], dtype=torch.int32), 4)


def test_cpu_run_writes_the_csv(tmp_path, capsys):
    path = tmp_path / "topk.csv"
    rc = bench.main(["--batch", "2", "--next-n", "2", "--context", "64", "--k", "8", "--backend", "torch",
                     "--replays", "1", "--out", str(path)])
    assert rc == 0
    text = path.read_text()
    assert "# versions: triton" in text and "# copy_bandwidth_GBps" in text
    rows = list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))
    assert [r["impl"] for r in rows] == ["torch.topk", "topk:torch"] * 2
    assert {r["lengths"] for r in rows} == {"uniform", "wide"}
    assert all(r["status"] == "ok" and float(r["us"]) > 0 and float(r["GBps"]) > 0 for r in rows)
    assert all(float(r["speedup_vs_torch_topk"]) > 0 for r in rows)


@pytest.mark.parametrize("argv, option", [
    (["--batch", "0"], "--batch"),
    (["--k", "x"], "--k"),
    (["--lengths", "ragged"], "--lengths"),
    (["--backend", "cuda"], "--backend"),
])
def test_option_errors(argv, option):
    with pytest.raises((CliError, SystemExit)) as error:
        bench.main(argv)
    assert option in str(error.value)


def test_vllm_persistent_topk_gets_max_seq_len_where_it_takes_one():
    """The staged module's ``signatures`` say whether persistent_topk takes ``max_seq_len`` (vLLM
    added it); the bench passes the row width then, and the five arguments of old otherwise."""
    calls = []

    class Staged:
        def __init__(self, params):
            self.signatures = {"persistent_topk": params}

        def top_k_per_row_decode(self, *args):
            pass

        def persistent_topk(self, *args):
            calls.append(args[4:])

    shape = bench.RowShape(batch=1, next_n=1, context=32, lengths="uniform", k=8)
    x, lens = torch.zeros(1, 32), torch.full((1,), 32, dtype=torch.int32)
    out = torch.empty(1, 8, dtype=torch.int32)
    for params in (("logits", "lengths", "output", "workspace", "k", "max_seq_len"),
                   ("logits", "lengths", "output", "workspace", "k")):
        bench.implementations(shape, [], Staged(params))["vllm:persistent_topk"](x, lens, lens, out)
    assert calls == [(8, 32), (8,)]


def test_csv_names_the_staged_vllm(tmp_path):
    """With ``--vllm DIR`` the header names the vLLM the folder was staged from (its manifest); a
    stand-in module (torch's top-k, vLLM's signature) is timed beside ours on CPU."""
    staged = tmp_path / "staged"
    (staged / "build").mkdir(parents=True)
    (staged / "manifest.json").write_text(json.dumps({"revision": "ab92a68c9c5021437f80", "version": "0.34.0"}))
    (staged / "build" / "vllm_topk_staged.py").write_text(
        "import torch\n"
        "def top_k_per_row_decode(logits, next_n, lens, out, rows, stride0, stride1, k):\n"
        "    seq = torch.arange(rows) // next_n\n"
        "    n = (lens[seq] - next_n + 1 + torch.arange(rows) % next_n).clamp(0, logits.shape[1])\n"
        "    cols = torch.arange(logits.shape[1])\n"
        "    masked = torch.where(cols[None, :] < n[:, None], logits, float('-inf'))\n"
        "    top = masked.topk(k, dim=1).indices.int()\n"
        "    out.copy_(torch.where(torch.arange(k)[None, :] < n[:, None], top, -1))\n")
    assert bench.staged_provenance(str(staged), "vllm") == (
        "# vllm: 0.34.0 (revision ab92a68c9c50, staged by tools/stage_vllm_topk.sh and built on this machine)")
    assert bench.staged_provenance(str(tmp_path), "vllm") is None  # no manifest: no line
    path = tmp_path / "topk.csv"
    try:
        rc = bench.main(["--batch", "2", "--next-n", "1", "--context", "64", "--k", "8", "--backend", "torch",
                         "--lengths", "uniform", "--replays", "1", "--vllm", str(staged), "--out", str(path)])
    finally:
        sys.modules.pop("vllm_topk_staged", None)
        sys.path.remove(str(staged / "build"))
    text = path.read_text()
    assert rc == 0 and "\n# vllm: 0.34.0 (revision ab92a68c9c50," in text
    rows = list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))
    assert [r["impl"] for r in rows] == ["torch.topk", "topk:torch", "vllm:top_k_per_row_decode"]
    assert all(r["status"] == "ok" for r in rows)
