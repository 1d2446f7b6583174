"""Which chip a tensor lives on, and how many compute units it has.

* ROCm: ``gfx942`` / ``gfx950`` / ... (``gcnArchName`` without feature flags), CU count.
* CUDA: ``sm_90`` style names (``sm_{major}{minor}``), SM count.
* CPU: ``cpu`` with 0 compute units.

``PAGED_MQA_LOGITS_ARCH`` and ``PAGED_MQA_LOGITS_CU_NUM`` override detection (both optional),
so a CPU machine can ask what a gfx950 with 256 CUs would pick. The override applies to every
non-CPU device; CPU tensors always run as ``cpu`` since no GPU kernel can run on them.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

import torch

from .errors import PagedMQAEnvironmentError

ENV_ARCH = "PAGED_MQA_LOGITS_ARCH"
ENV_CU_NUM = "PAGED_MQA_LOGITS_CU_NUM"

#: The archs the package knows, with the compute-unit count of their usual part: MI300X (304
#: CUs), MI355X (256 CUs), H100/H200 SXM (132 SMs). Used where a count must be assumed
#: (explain, precompile, the tuner's dry run) and never overrides a detected count.
USUAL_CU_NUM = {"gfx942": 304, "gfx950": 256, "sm_90": 132, "cpu": 0}

#: fp8 flavour each known arch computes in natively; archs not listed accept "fn"
NATIVE_FP8 = {"gfx942": "fnuz", "gfx950": "fn", "cpu": ("fn", "fnuz")}


@dataclass(frozen=True)
class ArchInfo:
    arch: str
    cu_num: int

    @property
    def is_amd(self) -> bool:
        return self.arch.startswith("gfx")

    @property
    def is_nvidia(self) -> bool:
        return self.arch.startswith("sm_")

    def supports_fp8(self, flavour: str) -> bool:
        native = NATIVE_FP8.get(self.arch, "fn")
        return flavour in native if isinstance(native, tuple) else flavour == native


def normalise_arch(name: str) -> str:
    """``sm90``/``sm_90``/``90`` -> ``sm_90``; ``gfx950:sramecc+:xnack-`` -> ``gfx950``."""
    name = name.strip().lower().split(":")[0]
    if name.isdigit():
        return f"sm_{name}"
    if name.startswith("sm") and not name.startswith("sm_"):
        return "sm_" + name[2:]
    return name


@functools.lru_cache(maxsize=None)
def _detect_gpu(device_index: int) -> ArchInfo:
    props = torch.cuda.get_device_properties(device_index)
    if getattr(torch.version, "hip", None):
        arch = normalise_arch(getattr(props, "gcnArchName", "gfx000"))
    else:
        arch = f"sm_{props.major}{props.minor}"
    return ArchInfo(arch, int(props.multi_processor_count))


def detect(device: torch.device | str | None = None) -> ArchInfo:
    """Arch of ``device`` (default: the current GPU if any, else CPU), with env overrides."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cpu":
        overrides()  # a bad value is reported wherever it is set, not only on GPU machines
        return ArchInfo("cpu", 0)
    info = _detect_gpu(device.index if device.index is not None else torch.cuda.current_device())
    return apply_override(info)


_ARCH_NAME = re.compile(r"(sm_\d{2,3}[a-z]?|gfx[0-9a-f]{3,4})")


def overrides() -> tuple[str | None, int | None]:
    """``(arch, cu_num)`` from the env (``None`` where unset). A value that is not a GPU arch
    name / a positive CU count raises :class:`PagedMQAEnvironmentError` naming the variable."""
    arch, cu_num = os.environ.get(ENV_ARCH), os.environ.get(ENV_CU_NUM)
    name = count = None
    if arch:
        name = normalise_arch(arch)
        if not _ARCH_NAME.fullmatch(name):
            raise PagedMQAEnvironmentError(
                f"paged_mqa_logits: environment variable {ENV_ARCH}: expected a GPU arch such as sm_90, gfx942 "
                f"or gfx950, got {arch!r}")
    if cu_num:
        text = cu_num.strip()
        if not text.isdigit() or int(text) < 1:
            raise PagedMQAEnvironmentError(
                f"paged_mqa_logits: environment variable {ENV_CU_NUM}: expected a positive integer (CUs or SMs), "
                f"got {cu_num!r}")
        count = int(text)
    return name, count


def apply_override(info: ArchInfo) -> ArchInfo:
    arch, cu_num = overrides()
    return ArchInfo(arch or info.arch, info.cu_num if cu_num is None else cu_num)


def gpu_name() -> str:
    """Human-readable name of the current GPU (or ``cpu``), for provenance records."""
    if not torch.cuda.is_available():
        return "cpu"
    return torch.cuda.get_device_name()
