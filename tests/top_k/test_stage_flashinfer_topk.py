"""``tools/stage_flashinfer_topk.sh`` on a small git repository laid out as FlashInfer's include/
is (same file names and quoted includes): the headers our binding includes and their quoted
includes are copied and nothing else, the manifest records the version, revision, files and the
signature of the dispatch ``binding.cu`` calls (which picks the ``-D`` flags of the build), and
every refusal is clear and writes nothing. Then the bench's side: the loader, the CSV's provenance
line, the skip of a folder that does not import, and the exactness check a FlashInfer row goes
through. The ``slow`` tests compile ``binding.cu`` against a staging of a real FlashInfer checkout
(``FLASHINFER_GITDIR``) with nvcc, and load the linked library on this machine."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import types

import pytest
import torch

from paged_mqa_logits.bench import topk as bench

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(ROOT, "tools", "flashinfer_topk")
SCRIPT = os.path.join(ROOT, "tools", "stage_flashinfer_topk.sh")
MIRROR = os.environ.get("FLASHINFER_GITDIR", "/work/.mirror/flashinfer-ai+flashinfer/repo")
GIT_ENV = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

#: the dispatch as FlashInfer 0.6.18 declares it (a comment and a default inside, as there)
SIGNATURE = ("template <typename DType, typename IdType>\n"
             "cudaError_t TopKRaggedTransformDispatch(DType* input, IdType* output_indices, const IdType* offsets,\n"
             "                                        IdType* lengths, const IdType* row_starts,  // per row\n"
             "                                        uint32_t num_rows, uint32_t top_k_val, uint32_t max_len,\n"
             "                                        RadixRowState* row_states_buffer, bool deterministic,\n"
             "                                        TopKTieBreak tie_break = TopKTieBreak::None,\n"
             "                                        cudaStream_t stream = 0, bool dsa_graph_safe = false) {\n"
             "  return cudaSuccess;\n}\n")
#: an earlier revision's (no row_starts, deterministic or tie-break)
OLD_SIGNATURE = ("cudaError_t TopKRaggedTransformDispatch(DType* input, IdType* output_indices,\n"
                 "    const IdType* offsets, IdType* lengths, uint32_t num_rows, uint32_t top_k_val,\n"
                 "    uint32_t max_len, RadixRowState* row_states_buffer, cudaStream_t stream = 0) {}\n")
FILES = {
    "version.txt": "0.6.18\n",
    "LICENSE": "Apache License 2.0\n",
    "include/flashinfer/topk.cuh": '#include <cub/cub.cuh>\n#include "topk_common.cuh"\n#include "utils.cuh"\n'
                                   '#include "vec_dtypes.cuh"\n' + SIGNATURE,
    "include/flashinfer/topk_common.cuh": "#include <cuda_bf16.h>\n",
    "include/flashinfer/utils.cuh": '#include <cuda_runtime.h>\n#include "exception.h"\n',
    "include/flashinfer/vec_dtypes.cuh": "",
    "include/flashinfer/exception.h": "",
    "include/flashinfer/math.cuh": "#include <cmath>\n",
    "include/flashinfer/sampling.cuh": '#include "math.cuh"\n#include "topk.cuh"\n',
    "csrc/topk.cu": "#include <flashinfer/topk.cuh>\n",
    "flashinfer/topk.py": "",
}
STAGED_HEADERS = ["include/flashinfer/math.cuh", "include/flashinfer/topk.cuh", "include/flashinfer/topk_common.cuh",
                  "include/flashinfer/utils.cuh", "include/flashinfer/vec_dtypes.cuh",
                  "include/flashinfer/exception.h"]
OURS = ["binding.cu", "build.py", "flashinfer_topk_staged.py", "manifest.json"]


def _load(path, name="staged_module"):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _commit(repo, files, message):
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    for args in (["add", "-A"], ["commit", "-qm", message]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=GIT_ENV)


def _repo(tmp_path, files=FILES):
    repo = tmp_path / "flashinfer"
    repo.mkdir()
    subprocess.run(["git", "-C", str(repo), "init", "-q"], check=True, env=GIT_ENV)
    _commit(repo, files, "layout")
    return repo


def _run(repo, dest, rev=None):
    env = dict(os.environ, **({"FLASHINFER_REV": rev} if rev else {}))
    return subprocess.run(["bash", SCRIPT, str(repo), str(dest)], check=False, capture_output=True, text=True, env=env)


def _listing(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@needs_git
def test_stage_copies_the_closure_and_records_the_manifest(tmp_path):
    repo, dest = _repo(tmp_path), tmp_path / "staged"
    result = _run(repo, dest)
    assert result.returncode == 0, result.stderr
    # sampling.cuh, csrc/ and the Python package are not what the binding includes: not staged
    assert _listing(dest) == sorted(STAGED_HEADERS + ["LICENSE"] + OURS)
    manifest = json.loads((dest / "manifest.json").read_text())
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    assert manifest["version"] == "0.6.18" and manifest["revision"] == head
    assert manifest["files"] == STAGED_HEADERS + ["LICENSE"]
    assert manifest["entry"]["name"] == "TopKRaggedTransformDispatch"
    assert manifest["entry"]["signature"] == (
        "cudaError_t TopKRaggedTransformDispatch(DType* input, IdType* output_indices, const IdType* offsets, "
        "IdType* lengths, const IdType* row_starts, uint32_t num_rows, uint32_t top_k_val, uint32_t max_len, "
        "RadixRowState* row_states_buffer, bool deterministic, TopKTieBreak tie_break = TopKTieBreak::None, "
        "cudaStream_t stream = 0, bool dsa_graph_safe = false)")
    assert manifest["entry"]["parameters"][4] == "row_starts" and len(manifest["entry"]["parameters"]) == 13
    with open(os.path.join(TOOLS, "binding.cu")) as f:
        assert (dest / "binding.cu").read_text() == f.read()
    build = _load(dest / "build.py")
    command = build.nvcc_command("nvcc", manifest, str(dest), "sm_90a", "out.so")
    assert {"-DFI_TOPK_ROW_STARTS=1", "-DFI_TOPK_DETERMINISTIC=1", "-DFI_TOPK_TIE_BREAK=1", "-arch=sm_90a",
            "-shared"} <= set(command)
    assert command[command.index("-I") + 1] == str(dest / "include")
    assert "-c" in build.nvcc_command("nvcc", manifest, str(dest), "sm_90", "o", compile_only=True)
    with pytest.raises(ValueError, match="--arch: expected sm_<major><minor>"):
        build.nvcc_command("nvcc", manifest, str(dest), "90", "o")
    assert "staged FlashInfer 0.6.18" in result.stdout


@needs_git
def test_an_earlier_revision_and_a_restage(tmp_path):
    """FLASHINFER_REV stages an older dispatch (fewer parameters, fewer -D flags; no version.txt:
    ``git describe``); staging again replaces the folder whole, its build/ included."""
    old = dict(FILES, **{"include/flashinfer/topk.cuh": '#include "utils.cuh"\n' + OLD_SIGNATURE})
    repo = _repo(tmp_path, {path: text for path, text in old.items() if path != "version.txt"})
    _commit(repo, {"include/flashinfer/topk.cuh": FILES["include/flashinfer/topk.cuh"], "version.txt": "0.7.0\n"},
            "newer")
    dest = tmp_path / "staged"
    assert _run(repo, dest, rev="HEAD~1").returncode == 0
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["version"] == manifest["revision"][:len(manifest["version"])]  # no tag: the commit
    assert "include/flashinfer/topk_common.cuh" not in manifest["files"]
    build = _load(dest / "build.py")
    assert build.binding_defines(manifest["entry"]["parameters"]) == []
    (dest / "build").mkdir()
    (dest / "build" / "flashinfer_topk_staged_cuda.so").write_text("old")
    assert _run(repo, dest).returncode == 0
    assert json.loads((dest / "manifest.json").read_text())["version"] == "0.7.0"
    assert not (dest / "build").exists() and not any(p.name.startswith(".staging-") for p in tmp_path.iterdir())


@needs_git
@pytest.mark.parametrize("change, message", [
    ({"include/flashinfer/topk.cuh": None}, "include/flashinfer/topk.cuh is missing at"),
    ({"include/flashinfer/math.cuh": None}, ("binding.cu includes <flashinfer/math.cuh>, but "
                                             "include/flashinfer/math.cuh is missing at")),
    ({"include/flashinfer/exception.h": None}, ('include/flashinfer/utils.cuh includes "exception.h", found neither '
                                                "as include/flashinfer/exception.h nor as include/exception.h at")),
    ({"include/flashinfer/topk.cuh": "int nothing;\n"}, "defines no `cudaError_t TopKRaggedTransformDispatch(`"),
    ({"include/flashinfer/topk.cuh": SIGNATURE.replace("bool deterministic", "bool deterministic, int pdl")},
     "(unknown: pdl)"),
])
def test_a_refusal_names_the_missing_piece_and_writes_nothing(tmp_path, change, message):
    files = {path: text for path, text in dict(FILES, **change).items() if text is not None}
    repo, dest = _repo(tmp_path, files), tmp_path / "staged"
    result = _run(repo, dest)
    assert result.returncode != 0 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not dest.exists() and not any(p.name.startswith(".staging-") for p in tmp_path.iterdir())


@needs_git
def test_bad_arguments(tmp_path):
    repo = _repo(tmp_path)
    result = _run(tmp_path / "nowhere", tmp_path / "d1")
    assert result.returncode != 0 and "FLASHINFER_GITDIR: expected a git directory, got" in result.stderr
    result = _run(repo, tmp_path / "d2", rev="no-such-rev")
    assert result.returncode != 0 and "FLASHINFER_REV: expected a revision of" in result.stderr
    assert "'no-such-rev'" in result.stderr
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    result = _run(repo, other)
    assert result.returncode != 0 and "DEST: expected a new folder or an earlier staging" in result.stderr
    assert _listing(other) == ["keep.txt"]
    assert subprocess.run(["bash", SCRIPT, str(repo)], check=False, capture_output=True, text=True).returncode == 2


def test_the_binding_names_the_headers_to_stage():
    stage = _load(os.path.join(TOOLS, "stage.py"), "fi_stage")
    assert stage.binding_roots() == ["include/flashinfer/math.cuh", "include/flashinfer/topk.cuh"]
    build = _load(os.path.join(TOOLS, "build.py"), "fi_build")
    assert build.parameter_names("cudaError_t f(std::pair<int, int> p, float* x = nullptr)") == ["p", "x"]
    with pytest.raises(ValueError, match=r"missing: stream"):
        build.binding_defines([n for n in build.REQUIRED if n != "stream"])


# ----------------------------------------------------------------------------- the bench's side
STAND_IN = ("import torch\n"
            "def top_k_ragged_transform(logits, lengths, out, k):\n"
            "    cols = torch.arange(logits.shape[1])\n"
            "    masked = torch.where(cols[None, :] < lengths[:, None].long(), logits, float('-inf'))\n"
            "    top = masked.topk(min(k, logits.shape[1]), dim=1).indices.int()\n"
            "    slot = torch.arange(top.shape[1])[None, :]\n"
            "    out.fill_(-1)\n"
            "    out[:, :top.shape[1]] = torch.where(slot < lengths[:, None], top, -1)\n"
            "    return out\n")


def _staged_folder(tmp_path, module_text=None):
    staged = tmp_path / "fi"
    (staged / "build").mkdir(parents=True)
    (staged / "manifest.json").write_text(json.dumps({"revision": "fb28d7242b3506a23482", "version": "0.6.18"}))
    if module_text is not None:
        (staged / "build" / "flashinfer_topk_staged.py").write_text(module_text)
    return staged


def _bench(staged, path, capsys):
    try:
        rc = bench.main(["--batch", "2", "--next-n", "2", "--context", "64", "--k", "8", "--backend", "torch",
                         "--lengths", "wide", "--replays", "1", "--flashinfer", str(staged), "--out", str(path)])
    finally:
        sys.modules.pop("flashinfer_topk_staged", None)
        sys.path.remove(str(staged / "build"))
    text = path.read_text()
    rows = list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))
    return rc, text, rows, capsys.readouterr().err


def test_the_bench_times_a_staged_flashinfer_and_names_it(tmp_path, capsys):
    staged = _staged_folder(tmp_path, STAND_IN)
    assert bench.staged_provenance(str(staged), "flashinfer") == (
        "# flashinfer: 0.6.18 (revision fb28d7242b35, staged by tools/stage_flashinfer_topk.sh and built on this "
        "machine)")
    assert bench.staged_provenance(str(tmp_path), "flashinfer") is None
    rc, text, rows, _ = _bench(staged, tmp_path / "fi.csv", capsys)
    assert rc == 0 and "\n# flashinfer: 0.6.18 (revision fb28d7242b35," in text
    assert [r["impl"] for r in rows] == ["torch.topk", "topk:torch", "flashinfer:top_k_ragged_transform"]
    assert all(r["status"] == "ok" for r in rows)


def test_a_wrong_flashinfer_selection_fails_the_run(tmp_path, capsys):
    """FlashInfer's rows go through the bench's exactness check as every implementation's do."""
    wrong = STAND_IN.replace("    return out\n", "    out[0, 0] = int(logits[0, :int(lengths[0])].argmin())\n"
                                                "    return out\n")
    rc, _, rows, _ = _bench(_staged_folder(tmp_path, wrong), tmp_path / "fi.csv", capsys)
    assert rc == 1 and rows[-1]["impl"] == "flashinfer:top_k_ragged_transform"
    assert rows[-1]["status"] == "FAIL: not the exact top-k"


def test_a_folder_that_does_not_import_is_noted_and_skipped(tmp_path, capsys):
    rc, text, rows, err = _bench(_staged_folder(tmp_path), tmp_path / "fi.csv", capsys)  # staged, not built
    assert rc == 0 and "note: --flashinfer" in err and "FlashInfer not timed" in err
    assert "# flashinfer:" not in text and {r["impl"] for r in rows} == {"torch.topk", "topk:torch"}


def test_the_wrapper_refuses_bad_arguments_by_name(tmp_path, monkeypatch):
    """The real ctypes wrapper, over a stand-in library (the real one needs the GPU machine's build)."""
    folder = tmp_path / "build"
    folder.mkdir()
    shutil.copy(os.path.join(TOOLS, "flashinfer_topk_staged.py"), folder)
    with pytest.raises(ImportError, match="is not built: run build.py"):
        _load(folder / "flashinfer_topk_staged.py")
    (folder / "flashinfer_topk_staged_cuda.so").write_text("")
    fake = types.SimpleNamespace(fi_topk_ragged_transform_f32=types.SimpleNamespace(),
                                 fi_topk_error_string=types.SimpleNamespace(),
                                 fi_topk_row_state_bytes=types.SimpleNamespace())
    monkeypatch.setattr("ctypes.CDLL", lambda path: fake)
    wrapper = _load(folder / "flashinfer_topk_staged.py")
    x, lens, out = torch.zeros(4, 64), torch.full((4,), 64, dtype=torch.int32), torch.empty(4, 8, dtype=torch.int32)
    cases = [((x.half(), lens, out, 8), "logits: expected fp32 [rows, width]"),
             ((x[:, :32], lens, out, 8), "logits: expected contiguous rows (strides (32, 1)), got (64, 1)"),
             ((torch.zeros(4 * 64 + 1)[1:].view(4, 64), lens, out, 8),
              "logits: expected a start aligned to 16 bytes, got an address 4 bytes past"),
             ((x, lens.long(), out, 8), "lengths: expected contiguous int32 [4]"),
             ((x, lens, out, 16), "out: expected contiguous int32 [4, 16]"),
             ((x, lens, out, 0), "k: expected a positive int, got 0"),
             ((x, lens, out, 8), "logits: expected a CUDA tensor, got cpu")]
    for args, message in cases:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            wrapper.top_k_ragged_transform(*args)


# ----------------------------------------------------------------------------- the real FlashInfer, nvcc
def _stage_mirror(tmp_path):
    if shutil.which("nvcc") is None or shutil.which("git") is None:
        pytest.skip("needs nvcc and git")
    if not os.path.isdir(MIRROR):
        pytest.skip(f"no FlashInfer git dir at {MIRROR} (set FLASHINFER_GITDIR)")
    dest = tmp_path / "staged"
    result = _run(MIRROR, dest)
    assert result.returncode == 0, result.stderr
    return dest, json.loads((dest / "manifest.json").read_text()), _load(dest / "build.py", "fi_real_build")


@pytest.mark.slow
def test_the_binding_compiles_against_a_real_staging(tmp_path):
    """nvcc -arch=sm_90 -c of binding.cu against the staged headers (no torch, no GPU)."""
    dest, manifest, build = _stage_mirror(tmp_path)
    command = build.nvcc_command(shutil.which("nvcc"), manifest, str(dest), "sm_90", str(tmp_path / "binding.o"),
                                 compile_only=True)
    result = subprocess.run(command, check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "binding.o").stat().st_size > 0


@pytest.mark.slow
def test_the_linked_library_loads_and_refuses_a_row_stride(tmp_path):
    """The shared library build.py links loads without a GPU; its checks answer before any CUDA call."""
    import ctypes

    dest, manifest, build = _stage_mirror(tmp_path)
    library = tmp_path / "flashinfer_topk_staged_cuda.so"
    result = subprocess.run(build.nvcc_command(shutil.which("nvcc"), manifest, str(dest), "sm_90", str(library)),
                            check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    lib = ctypes.CDLL(str(library))
    lib.fi_topk_error_string.restype = ctypes.c_char_p
    lib.fi_topk_row_state_bytes.restype = ctypes.c_int64
    assert lib.fi_topk_row_state_bytes() >= 3 * 256 * 4  # three 256-bin histograms, then counters
    i64 = ctypes.c_int64
    code = lib.fi_topk_ragged_transform_f32(None, i64(4), i64(64), i64(80), None, None, None, i64(8), None, 0, None)
    assert code == -1
    assert lib.fi_topk_error_string(code).decode() == (
        "row_stride: FlashInfer's ragged transform reads rows at the row width 64, got a stride of 80")
