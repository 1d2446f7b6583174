"""Build the staged FlashInfer top-k into ``build/flashinfer_topk_staged_cuda.so`` and put its
ctypes wrapper beside it as ``build/flashinfer_topk_staged.py`` (run on the GPU machine, from
anywhere: ``python DEST/build.py [--arch sm_90a]``); ``bench --topk --flashinfer DEST`` imports it.

Why nvcc and ctypes rather than torch's extension loader (which vLLM's build uses): ``binding.cu``
is plain CUDA (raw pointers and the caller's stream behind one ``extern "C"`` entry), so the build
needs nvcc and the staged headers only, no torch headers or pybind11; the very command that builds
it here compiles on a machine without a GPU or torch (tests/top_k/test_stage_flashinfer_topk.py);
and the wrapper launches it on torch's current stream, so CUDA graphs capture it. The CUDA runtime
is linked statically (nvcc's default): the library loads without a search path, and kernels,
streams and graphs are the driver's, shared with torch's runtime.

``binding.cu`` calls ``TopKRaggedTransformDispatch`` with the parameters the staged revision's
signature has (``manifest.json``): ``binding_defines`` turns them into ``-D`` flags."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = "flashinfer_topk_staged"
LIBRARY = f"{MODULE}_cuda.so"  # not importable as a Python extension: the wrapper's name stays free
#: FlashInfer's release JIT flags for its CUDA sources, and its default C++ standard
NVCC_FLAGS = ["-std=c++17", "-O3", "-DNDEBUG", "-use_fast_math", "--expt-relaxed-constexpr",
              "-DFLASHINFER_ENABLE_F16", "-DFLASHINFER_ENABLE_BF16"]
#: parameter names of TopKRaggedTransformDispatch binding.cu passes in order; the optional ones
#: appeared in later revisions and map to a -D flag each (dsa_graph_safe is defaulted, left out)
REQUIRED = ("input", "output_indices", "offsets", "lengths", "num_rows", "top_k_val", "max_len",
            "row_states_buffer", "stream")
OPTIONAL = {"row_starts": "FI_TOPK_ROW_STARTS", "deterministic": "FI_TOPK_DETERMINISTIC",
            "tie_break": "FI_TOPK_TIE_BREAK", "dsa_graph_safe": None}


def parameter_names(signature: str) -> list[str]:
    """The parameter names of a C++ signature (top-level commas; default values dropped). The split on
    top-level commas repeats ``tools/vllm_topk/build.py``'s on purpose: each build script runs alone from
    its staged folder, where the other is not."""
    inner = signature[signature.index("(") + 1:signature.rindex(")")]
    parts, depth, current = [], 0, ""
    for ch in inner:
        depth += {"(": 1, "<": 1, ")": -1, ">": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts += [current] if current.strip() else []
    names = []
    for part in parts:
        match = re.search(r"([A-Za-z_]\w*)\s*$", part.split("=")[0])
        if match is None:
            raise ValueError(f"cannot read the parameter {part.strip()!r} of {signature}")
        names.append(match.group(1))
    return names


def binding_defines(names: list[str]) -> list[str]:
    """``-D`` flags telling binding.cu which optional parameters the staged dispatch takes; a
    ValueError naming what binding.cu cannot pass otherwise."""
    unknown = [n for n in names if n not in REQUIRED and n not in OPTIONAL]
    missing = [n for n in REQUIRED if n not in names]
    if unknown or missing:
        raise ValueError(f"binding.cu passes {', '.join(REQUIRED)} (and optionally {', '.join(OPTIONAL)}); "
                         f"the staged signature has {', '.join(names)}"
                         + (f" (unknown: {', '.join(unknown)})" if unknown else "")
                         + (f" (missing: {', '.join(missing)})" if missing else ""))
    return [f"-D{flag}=1" for name, flag in OPTIONAL.items() if flag and name in names]


def nvcc_command(nvcc: str, manifest: dict, root: str, arch: str, output: str, compile_only: bool = False) -> list[str]:
    """nvcc compiling ``root/binding.cu`` against the headers staged under ``root/include`` for
    ``arch`` (``sm_90a``, ...): a shared library, or with ``compile_only`` an object (``-c``)."""
    if not re.fullmatch(r"sm_\d+[af]?", arch):
        raise ValueError(f"--arch: expected sm_<major><minor>[a|f] such as sm_90a, got {arch!r}")
    link = ["-c"] if compile_only else ["-shared", "-Xcompiler", "-fPIC"]
    return [nvcc, *NVCC_FLAGS, f"-arch={arch}", *binding_defines(manifest["entry"]["parameters"]),
            "-I", os.path.join(root, "include"), *link, os.path.join(root, "binding.cu"), "-o", output]


def find_nvcc() -> str:
    """nvcc of ``CUDA_HOME`` (or torch's idea of it), else the one on PATH."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    try:
        from torch.utils.cpp_extension import CUDA_HOME
        homes.append(CUDA_HOME)
    except ImportError:
        pass
    for home in filter(None, homes):
        if os.path.isfile(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    found = shutil.which("nvcc")
    if found is None:
        raise SystemExit("build: no nvcc (set CUDA_HOME or put nvcc on PATH)")
    return found


def device_arch() -> str:
    """``sm_<major><minor>`` of the current GPU, with FlashInfer's ``a`` suffix from sm_90 on."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("build: no CUDA device to take the arch from; pass --arch (e.g. --arch sm_90a)")
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default=None, help="sm_<major><minor>[a], default the current GPU's")
    a = p.parse_args(argv)
    with open(os.path.join(HERE, "manifest.json")) as f:
        manifest = json.load(f)
    build = os.path.join(HERE, "build")
    os.makedirs(build, exist_ok=True)
    arch = a.arch or device_arch()
    library = os.path.join(build, LIBRARY)
    try:
        command = nvcc_command(find_nvcc(), manifest, HERE, arch, library + ".tmp")
    except ValueError as exc:
        raise SystemExit(f"build: {exc}") from None
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)
    os.replace(library + ".tmp", library)  # a failed build leaves no library the bench would load
    shutil.copy(os.path.join(HERE, f"{MODULE}.py"), os.path.join(build, f"{MODULE}.py"))
    print(f"built {library} (FlashInfer {manifest['version']}, {manifest['revision'][:12]}, {arch})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
