"""Build the staged vLLM top-k kernels into ``build/vllm_topk_staged*.so`` with torch's extension
loader (run on the GPU machine, from anywhere: ``python DEST/build.py``). The entry points are
bound with the signatures ``manifest.json`` recorded from their definitions, so any staged
revision links; ``bench --topk --vllm DEST`` imports the result.

Two tensor ABIs are bound:
* "aten" (``torch::Tensor`` parameters, older vLLM): bound as they are.
* "stable" (``torch::stable::Tensor``, vLLM after its libtorch stable ABI migration): vLLM
  registers these with ``STABLE_TORCH_LIBRARY`` in a file that is not staged; here each gets a
  pybind11 wrapper taking ``at::Tensor`` and handing the kernel a ``torch::stable::Tensor`` that
  shares the tensor's storage (in-place outputs stay visible). The staged ``.cu`` files are
  compiled with ``USE_CUDA`` and the manifest's ``TORCH_TARGET_VERSION``; the bindings file is
  not (``torch/extension.h`` refuses to compile under ``TORCH_TARGET_VERSION``).

The module also carries ``signatures``: entry point -> its parameter names, so a caller can see
whether, say, ``persistent_topk`` takes ``max_seq_len`` at this revision."""

from __future__ import annotations

import glob
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = "vllm_topk_staged"

_SCALARS = ("int64_t", "double", "bool")
#: vLLM's CMake drops torch's half/bfloat16 operator bans from the nvcc flags (CUDA >= 12) and
#: defines ENABLE_FP8; the kernels are compiled as vLLM compiles them
VLLM_NVCC_FLAGS = ["-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                   "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__", "-DENABLE_FP8"]


def parameters(signature: str) -> list[tuple[str, str]]:
    """``[(type, name), ...]`` of a ``void name(...)`` signature (top-level commas only)."""
    inner = signature[signature.index("(") + 1:signature.rindex(")")]
    parts, depth, current = [], 0, ""
    for ch in inner:
        depth += {"(": 1, "<": 1, ")": -1, ">": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current)
    out = []
    for part in parts:
        part = part.split("=")[0].strip()  # default arguments
        match = re.match(r"^(.*?)([A-Za-z_]\w*)$", part)
        if match is None or not match.group(1).strip():
            raise ValueError(f"cannot read the parameter {part!r} of {signature}")
        out.append((" ".join(match.group(1).split()), match.group(2)))
    return out


def _stable_wrapper(name: str, signature: str) -> tuple[list[str], str]:
    """(lines of a lambda taking ``at::Tensor``s, the ``py::arg`` list) for a stable entry point."""
    params = parameters(signature)
    args, prologue, call = [], [], []
    for ctype, pname in params:
        plain = ctype.replace("const", "").replace("&", "").strip()
        if plain == "torch::stable::Tensor":
            args.append(f"const at::Tensor& {pname}")
            prologue.append(f"    torch::stable::Tensor s_{pname} = to_stable({pname});")
            call.append(f"s_{pname}")
        elif plain == "std::optional<torch::stable::Tensor>":
            args.append(f"const std::optional<at::Tensor>& {pname}")
            prologue.append(f"    std::optional<torch::stable::Tensor> s_{pname};")
            prologue.append(f"    if ({pname}.has_value()) s_{pname} = to_stable(*{pname});")
            call.append(f"s_{pname}")
        elif plain in _SCALARS:
            args.append(f"{plain} {pname}")
            call.append(pname)
        else:
            raise ValueError(f"{name}: no binding for a parameter of type {ctype!r}")
    lines = [f"  m.def(\"{name}\", []({', '.join(args)}) {{"]
    lines += prologue
    lines += [f"    {name}({', '.join(call)});", "  }"]
    return lines, ", ".join(f'py::arg("{p}")' for _, p in params)


def bindings(manifest: dict) -> str:
    """C++ declaring each entry point as staged and binding it under its own name."""
    entries = manifest["entry_points"]
    stable = any(e.get("abi", "aten") == "stable" for e in entries.values())
    lines = ["#include <torch/extension.h>"]
    if stable:
        lines += ["#include <optional>", "#include <torch/csrc/stable/tensor.h>",
                  "#include <torch/csrc/inductor/aoti_torch/utils.h>", "",
                  "namespace {",
                  "// A stable tensor owning a new reference to t's TensorImpl (same storage, same strides).",
                  "torch::stable::Tensor to_stable(const at::Tensor& t) {",
                  "  return torch::stable::Tensor(torch::aot_inductor::new_tensor_handle(at::Tensor(t)));",
                  "}",
                  "}  // namespace"]
    lines += [""]
    lines += [entry["signature"] + ";" for entry in entries.values()]
    lines += ["", "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {", "  py::dict signatures;"]
    for name, entry in entries.items():
        names = ", ".join(f'"{p}"' for _, p in parameters(entry["signature"]))
        lines.append(f'  signatures["{name}"] = py::make_tuple({names});')
        if entry.get("abi", "aten") == "stable":
            body, pyargs = _stable_wrapper(name, entry["signature"])
            body[-1] += f", {pyargs});"
            lines += body
        else:
            lines.append(f'  m.def("{name}", &{name});')
    lines += ['  m.attr("signatures") = signatures;', "}", ""]
    return "\n".join(lines)


def sources(manifest: dict, root: str) -> list[str]:
    return sorted({os.path.join(root, entry["file"]) for entry in manifest["entry_points"].values()})


def include_dirs(manifest: dict, root: str) -> list[str]:
    return sorted({os.path.join(root, os.path.dirname(path)) for path in manifest["files"]} | {os.path.join(root, "csrc")})


def cuda_defines(manifest: dict) -> list[str]:
    """nvcc defines for the staged ``.cu`` files (never for the bindings file)."""
    if not any(e.get("abi", "aten") == "stable" for e in manifest["entry_points"].values()):
        return []
    flags = ["-DUSE_CUDA"]  # the C shims declare their CUDA entry points (current stream) only then
    if manifest.get("torch_target_version"):
        flags.append(f"-DTORCH_TARGET_VERSION={manifest['torch_target_version']}")
    return flags


def cublas_shim(build: str, cuda_home: str | None, search: list[str]) -> str | None:
    """A folder with a ``cublas_v2.h`` for CUDA installs without cuBLAS headers, or None where the
    toolkit has one. vLLM's torch_utils.h includes it for the ``cublasHandle_t`` type alone; the
    shim includes the real header where one is found under ``search`` (pip's nvidia packages), else
    declares that opaque type as cuBLAS does."""
    if cuda_home and glob.glob(os.path.join(cuda_home, "include", "cublas_v2.h")) + glob.glob(
            os.path.join(cuda_home, "targets", "*", "include", "cublas_v2.h")):
        return None
    found = [hit for base in search for hit in sorted(glob.glob(os.path.join(base, "nvidia", "*", "include",
                                                                             "cublas_v2.h")))]
    folder = os.path.join(build, "cublas_shim")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "cublas_v2.h"), "w") as f:
        f.write("#pragma once\n")
        f.write(f'#include "{found[0]}"\n' if found else "struct cublasContext;\ntypedef struct cublasContext* cublasHandle_t;\n")
    return folder


def main() -> int:
    with open(os.path.join(HERE, "manifest.json")) as f:
        manifest = json.load(f)
    build = os.path.join(HERE, "build")
    os.makedirs(build, exist_ok=True)
    binding = os.path.join(build, "bindings.cpp")
    with open(binding, "w") as f:
        f.write(bindings(manifest))
    import torch
    from torch.utils import cpp_extension

    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}" + ("a" if major >= 9 else "")
    includes = include_dirs(manifest, HERE)
    shim = cublas_shim(build, cpp_extension.CUDA_HOME, [p for p in sys.path if os.path.isdir(p)])
    if shim:
        includes.append(shim)
    module = cpp_extension.load(
        name=MODULE, sources=sources(manifest, HERE) + [binding], extra_include_paths=includes,
        extra_cflags=["-O3", "-std=c++20"],
        extra_cuda_cflags=["-O3", "-std=c++20", "--expt-relaxed-constexpr", "--expt-extended-lambda", "-DNDEBUG",
                           f"-gencode=arch=compute_{arch},code=sm_{arch}"] + VLLM_NVCC_FLAGS + cuda_defines(manifest),
        build_directory=build, verbose=True)
    print(f"built {MODULE} (vLLM {manifest['revision'][:12]}): " + ", ".join(
        f"{n}{tuple(module.signatures[n])}" for n in manifest["entry_points"] if hasattr(module, n)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
