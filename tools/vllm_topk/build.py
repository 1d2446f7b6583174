"""Build the staged vLLM top-k kernels into ``build/vllm_topk_staged*.so`` with torch's extension
loader (run on the GPU machine, from anywhere: ``python DEST/build.py``). The entry points are
bound with the signatures ``manifest.json`` recorded from their definitions, so any staged
revision links; ``bench --topk --vllm DEST`` imports the result."""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = "vllm_topk_staged"


def bindings(manifest: dict) -> str:
    """C++ declaring each entry point as staged and binding it under its own name."""
    lines = ["#include <torch/extension.h>", ""]
    lines += [entry["signature"] + ";" for entry in manifest["entry_points"].values()]
    lines += ["", "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
    lines += [f'  m.def("{name}", &{name});' for name in manifest["entry_points"]]
    lines += ["}", ""]
    return "\n".join(lines)


def sources(manifest: dict, root: str) -> list[str]:
    return sorted({os.path.join(root, entry["file"]) for entry in manifest["entry_points"].values()})


def include_dirs(manifest: dict, root: str) -> list[str]:
    return sorted({os.path.join(root, os.path.dirname(path)) for path in manifest["files"]} | {os.path.join(root, "csrc")})


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
    module = cpp_extension.load(
        name=MODULE, sources=sources(manifest, HERE) + [binding], extra_include_paths=include_dirs(manifest, HERE),
        extra_cuda_cflags=["-O3", "--expt-relaxed-constexpr", "--expt-extended-lambda", "-DNDEBUG",
                           f"-gencode=arch=compute_{arch},code=sm_{arch}"],
        build_directory=build, verbose=True)
    print(f"built {MODULE} (vLLM {manifest['revision'][:12]}): " + ", ".join(n for n in manifest["entry_points"]
                                                                          if hasattr(module, n)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
