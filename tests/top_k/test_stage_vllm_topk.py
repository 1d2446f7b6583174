"""``tools/stage_vllm_topk.sh`` on a small git repository laid out as vLLM's csrc/ is (same file
names and quoted includes): the entry files are found by what they define, the include closure
is copied and nothing else, the signatures recorded are the definitions', and the bindings the
build generates declare and bind them. Both of vLLM's tensor ABIs: ``torch::Tensor`` (older) and
``torch::stable::Tensor`` (after its libtorch stable ABI migration, with the TORCH_TARGET_VERSION
its CMakeLists.txt sets)."""

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


#: the stable-ABI layout (vLLM 0.34: csrc/topk.cu calls sampler.cu's decode kernel; includes
#: under csrc/core/; the target version in the top-level CMakeLists.txt)
STABLE_FILES = {
    "CMakeLists.txt": "  target_compile_definitions(_C_stable_libtorch PRIVATE\n"
                      "    TORCH_TARGET_VERSION=0x020B000000000000ULL)\n",
    "csrc/sampler.cu": '#include "core/cuda_compat.h"\n#include "dispatch_utils.h"\n#include "torch_utils.h"\n'
                       "void top_k_per_row_decode(const torch::stable::Tensor& logits, int64_t next_n,\n"
                       "                          const torch::stable::Tensor& seqLens,\n"
                       "                          torch::stable::Tensor& indices, int64_t numRows,\n"
                       "                          int64_t stride0, int64_t stride1, int64_t topK) {\n}\n",
    "csrc/topk.cu": '#include "ops.h"\n#include "torch_utils.h"\n#ifndef USE_ROCM\n  #include "persistent_topk.cuh"\n'
                    "#endif\nvoid persistent_topk(const torch::stable::Tensor& logits,\n"
                    "                     const torch::stable::Tensor& lengths,\n"
                    "                     torch::stable::Tensor& output,\n"
                    "                     torch::stable::Tensor& workspace, int64_t k,\n"
                    "                     int64_t max_seq_len) {\n}\n",
    "csrc/core/cuda_compat.h": "",
    "csrc/dispatch_utils.h": "",
    "csrc/torch_utils.h": "#include <cublas_v2.h>\n",
    "csrc/ops.h": "",
    "csrc/persistent_topk.cuh": '#include "topk_histogram_4096.cuh"\n',
    "csrc/topk_histogram_4096.cuh": "",
    "csrc/cache_kernels.cu": "void reshape_and_cache() {}\n",
}


def _load_build(path):
    spec = importlib.util.spec_from_file_location("staged_build", path)
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build


def _repo(tmp_path, files=FILES):
    repo = tmp_path / "vllm"
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "layout"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env)
    return repo


def _stage(tmp_path, files):
    """Stage a fake vLLM tree of ``files`` with the script: ``(dest, staged file names, manifest)``."""
    repo, dest = _repo(tmp_path, files), tmp_path / "staged"
    result = subprocess.run(["bash", os.path.join(ROOT, "tools", "stage_vllm_topk.sh"), str(repo), str(dest)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    staged = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    return dest, staged, json.loads((dest / "manifest.json").read_text())


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_stage_copies_the_closure_and_records_signatures(tmp_path):
    dest, staged, manifest = _stage(tmp_path, FILES)
    expected = sorted(set(FILES) - {"csrc/cache_kernels.cu", "csrc/libtorch_stable/other.cu"})
    assert staged == sorted(expected + ["build.py", "manifest.json"])
    assert manifest["entry_points"]["top_k_per_row_decode"] == {
        "file": "csrc/sampler.cu",
        "signature": "void top_k_per_row_decode(const torch::Tensor& logits, int64_t next_n, const torch::Tensor& "
                     "seqLens, torch::Tensor& indices, int64_t numRows, int64_t stride0, int64_t stride1, "
                     "int64_t topK)",
        "abi": "aten"}
    assert manifest["entry_points"]["persistent_topk"]["file"] == "csrc/topk.cu"
    assert "torch_target_version" not in manifest
    assert manifest["unresolved_includes"] == ["csrc/flashinfer_utils.cuh: generated_by_cmake.h"]
    assert manifest["version"] == manifest["revision"][:len(manifest["version"])]  # no tag, no PKG-INFO: the commit

    build = _load_build(dest / "build.py")
    text = build.bindings(manifest)
    assert manifest["entry_points"]["persistent_topk"]["signature"] + ";" in text
    assert 'm.def("top_k_per_row_decode", &top_k_per_row_decode);' in text
    assert 'signatures["persistent_topk"] = py::make_tuple("logits", "lengths", "output", "workspace", "k");' in text
    assert "to_stable" not in text and build.cuda_defines(manifest) == []
    assert build.sources(manifest, "R") == ["R/csrc/sampler.cu", "R/csrc/topk.cu"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_stage_binds_the_stable_abi(tmp_path):
    dest, staged, manifest = _stage(tmp_path, STABLE_FILES)
    expected = sorted(set(STABLE_FILES) - {"CMakeLists.txt", "csrc/cache_kernels.cu"})
    assert staged == sorted(expected + ["build.py", "manifest.json"])
    assert {n: e["abi"] for n, e in manifest["entry_points"].items()} == {
        "top_k_per_row_decode": "stable", "persistent_topk": "stable"}
    assert manifest["torch_target_version"] == "0x020B000000000000ULL"
    assert manifest["entry_points"]["persistent_topk"]["signature"] == (
        "void persistent_topk(const torch::stable::Tensor& logits, const torch::stable::Tensor& lengths, "
        "torch::stable::Tensor& output, torch::stable::Tensor& workspace, int64_t k, int64_t max_seq_len)")

    build = _load_build(dest / "build.py")
    assert build.cuda_defines(manifest) == ["-DUSE_CUDA", "-DTORCH_TARGET_VERSION=0x020B000000000000ULL"]
    text = build.bindings(manifest)
    # declared with the stable types (the linker matches them), called through at::Tensor wrappers
    assert manifest["entry_points"]["top_k_per_row_decode"]["signature"] + ";" in text
    assert "TORCH_TARGET_VERSION" not in text
    assert ('m.def("persistent_topk", [](const at::Tensor& logits, const at::Tensor& lengths, '
            "const at::Tensor& output, const at::Tensor& workspace, int64_t k, int64_t max_seq_len) {") in text
    assert "    persistent_topk(s_logits, s_lengths, s_output, s_workspace, k, max_seq_len);" in text
    assert ('  }, py::arg("logits"), py::arg("next_n"), py::arg("seqLens"), py::arg("indices"), '
            'py::arg("numRows"), py::arg("stride0"), py::arg("stride1"), py::arg("topK"));') in text
    assert 'signatures["persistent_topk"] = py::make_tuple("logits", "lengths", "output", "workspace", "k", ' \
           '"max_seq_len");' in text
    assert text.count("{") == text.count("}")


def test_parameters_and_optional_tensors():
    build = _load_build(os.path.join(ROOT, "tools", "vllm_topk", "build.py"))
    sig = ("void f(const torch::stable::Tensor& a, std::optional<torch::stable::Tensor> b,\n"
           " int64_t n = 4, double eps, bool flag)")
    assert build.parameters(sig) == [("const torch::stable::Tensor&", "a"),
                                     ("std::optional<torch::stable::Tensor>", "b"), ("int64_t", "n"),
                                     ("double", "eps"), ("bool", "flag")]
    lines, args = build._stable_wrapper("f", sig)
    assert "const std::optional<at::Tensor>& b" in lines[0]
    assert "    if (b.has_value()) s_b = to_stable(*b);" in lines
    assert args.startswith('py::arg("a"), py::arg("b"), py::arg("n")')
    with pytest.raises(ValueError, match="no binding"):
        build._stable_wrapper("g", "void g(const void* p)")


def test_cublas_shim(tmp_path):
    build = _load_build(os.path.join(ROOT, "tools", "vllm_topk", "build.py"))
    cuda = tmp_path / "cuda"
    (cuda / "include").mkdir(parents=True)
    shim = build.cublas_shim(str(tmp_path / "b1"), str(cuda), [])
    assert (tmp_path / "b1" / "cublas_shim" / "cublas_v2.h").read_text().endswith(
        "typedef struct cublasContext* cublasHandle_t;\n")
    assert shim == str(tmp_path / "b1" / "cublas_shim")
    pip = tmp_path / "site" / "nvidia" / "cu13" / "include"
    pip.mkdir(parents=True)
    (pip / "cublas_v2.h").write_text("")
    build.cublas_shim(str(tmp_path / "b2"), str(cuda), [str(tmp_path / "site")])
    assert f'#include "{pip / "cublas_v2.h"}"' in (tmp_path / "b2" / "cublas_shim" / "cublas_v2.h").read_text()
    (cuda / "include" / "cublas_v2.h").write_text("")
    assert build.cublas_shim(str(tmp_path / "b3"), str(cuda), []) is None


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


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_stage_records_an_sdists_version(tmp_path):
    """An sdist put under git (no tags) names its version in PKG-INFO; the manifest records it, for
    the bench's CSV header."""
    pkg_info = "Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0\nSummary: x\n"
    _, _, manifest = _stage(tmp_path, dict(FILES, **{"PKG-INFO": pkg_info}))
    assert manifest["version"] == "0.34.0"
