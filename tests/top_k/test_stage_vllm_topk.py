"""``tools/stage_vllm_topk.sh`` on a small git repository laid out as vLLM's csrc/ is (same file
names and quoted includes): the entry files are found by what they define, the include closure
is copied and nothing else, the signatures recorded are the definitions', and the bindings the
build generates declare and bind them."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = {
    "csrc/sampler.cu": '#include "cuda_compat.h"\n#include "dispatch_utils.h"\n#include <torch/cuda.h>\n'
                       '#include "cub_helpers.h"\nvoid apply_repetition_penalties_(torch::Tensor& logits) {}\n'
                       "void top_k_per_row_decode(const torch::Tensor& logits, int64_t next_n,\n"
                       "                          const torch::Tensor& seqLens, torch::Tensor& indices,  // rows\n"
                       "                          int64_t numRows, int64_t stride0, int64_t stride1,\n"
                       "                          int64_t topK) {\n  body(f(x));\n}\n",
    "csrc/topk.cu": '#include "cuda_compat.h"\n#include "topk.cuh"\n#include "persistent_topk.cuh"\n'
                    "void persistent_topk(const torch::Tensor& logits, const torch::Tensor& lengths,\n"
                    "                     torch::Tensor& output, torch::Tensor& workspace,\n"
                    "                     int64_t k) {\n}\n",
    "csrc/topk.cuh": '#include "flashinfer_utils.cuh"\n#include "flashinfer_vec.cuh"\n',
    "csrc/persistent_topk.cuh": "#include <cuda.h>\n",
    "csrc/flashinfer_utils.cuh": '#include "generated_by_cmake.h"\n',
    "csrc/flashinfer_vec.cuh": "",
    "csrc/cuda_compat.h": "",
    "csrc/dispatch_utils.h": "",
    "csrc/cub_helpers.h": "",
    "csrc/cache_kernels.cu": '#include "cuda_compat.h"\nvoid reshape_and_cache() {}\n',
    "csrc/libtorch_stable/other.cu": "void top_k_per_row_prefill(int x) {}\n",
}


def _repo(tmp_path):
    repo = tmp_path / "vllm"
    for path, text in FILES.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "layout"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env)
    return repo


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_stage_copies_the_closure_and_records_signatures(tmp_path):
    repo, dest = _repo(tmp_path), tmp_path / "staged"
    result = subprocess.run(["bash", os.path.join(ROOT, "tools", "stage_vllm_topk.sh"), str(repo), str(dest)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    staged = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    expected = sorted(set(FILES) - {"csrc/cache_kernels.cu", "csrc/libtorch_stable/other.cu"})
    assert staged == sorted(expected + ["build.py", "manifest.json"])
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["entry_points"]["top_k_per_row_decode"] == {
        "file": "csrc/sampler.cu",
        "signature": "void top_k_per_row_decode(const torch::Tensor& logits, int64_t next_n, const torch::Tensor& "
                     "seqLens, torch::Tensor& indices, int64_t numRows, int64_t stride0, int64_t stride1, "
                     "int64_t topK)"}
    assert manifest["entry_points"]["persistent_topk"]["file"] == "csrc/topk.cu"
    assert manifest["unresolved_includes"] == ["csrc/flashinfer_utils.cuh: generated_by_cmake.h"]

    spec = importlib.util.spec_from_file_location("staged_build", dest / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    text = build.bindings(manifest)
    assert manifest["entry_points"]["persistent_topk"]["signature"] + ";" in text
    assert 'm.def("top_k_per_row_decode", &top_k_per_row_decode);' in text
    assert build.sources(manifest, "R") == ["R/csrc/sampler.cu", "R/csrc/topk.cu"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_stage_refuses_a_revision_without_the_entry_points(tmp_path):
    repo = _repo(tmp_path)
    for path in ("csrc/sampler.cu", "csrc/topk.cu"):
        (repo / path).write_text("int nothing;\n")
    subprocess.run(["git", "-C", str(repo), "commit", "-qam", "gone"], check=True,
                   env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                            GIT_COMMITTER_EMAIL="t@t"))
    result = subprocess.run(["bash", os.path.join(ROOT, "tools", "stage_vllm_topk.sh"), str(repo),
                             str(tmp_path / "staged")], capture_output=True, text=True)
    assert result.returncode != 0 and "none of top_k_per_row_decode, persistent_topk found" in result.stderr
