"""The chips the package knows (:data:`ARCH_SPECS`, the one home of every per-arch fact), and
which chip a tensor lives on with how many compute units.

* ROCm: ``gfx942`` / ``gfx950`` / ... (``gcnArchName`` without feature flags), CU count.
* CUDA: ``sm_90`` style names (``sm_{major}{minor}``), SM count.
* CPU: ``cpu`` with 0 compute units.

``PAGED_MQA_LOGITS_ARCH`` and ``PAGED_MQA_LOGITS_CU_NUM`` override detection (both optional),
so a CPU machine can ask what a gfx950 with 256 CUs would pick. The override applies to every
non-CPU device; CPU tensors always run as ``cpu`` since no GPU kernel can run on them.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass

import torch

from .triton_internals import compiler
from .errors import PagedMQAEnvironmentError

ENV_ARCH = "PAGED_MQA_LOGITS_ARCH"
ENV_CU_NUM = "PAGED_MQA_LOGITS_CU_NUM"

@dataclass(frozen=True)
class ArchSpec:
    """What the package needs to know about one chip. Everything per-arch reads it from here."""

    name: str
    #: fp8 e4m3 flavour(s) the chip computes in natively, the preferred one first: "fnuz" (gfx942)
    #: or "fn" (OCP: gfx950, Hopper); the CPU computes either
    fp8: tuple[str, ...]
    #: compute units (CUs / SMs) of the usual part: MI300X, MI355X, H100/H200 SXM. Used where a
    #: count must be assumed (explain, precompile, the tuner's dry run); never overrides a
    #: detected count
    usual_cu_num: int
    warp_size: int = 0  # lanes per wave / warp (0: no GPU)
    #: LDS (AMD: per CU, shared by the workgroups resident on it) / shared memory (NVIDIA: the
    #: most one CTA may use) in bytes; 0 where there is none
    lds_bytes: int = 0
    vgprs_per_simd: int = 0  # AMD: VGPRs per SIMD lane (arch VGPRs + AGPRs, one file); 0 elsewhere
    #: the usual part's peak HBM bandwidth (GB/s) and peak engine clock (MHz), from the vendor's
    #: data sheets (MI300X: 5.3 TB/s, 2100 MHz; MI355X: 8 TB/s, 2400 MHz); 0 where unused. Only
    #: static models read them (``tools/topk_amd_model.py``); nothing at run time does
    hbm_gbps: int = 0
    clock_mhz: int = 0


ARCH_SPECS: dict[str, ArchSpec] = {
    spec.name: spec for spec in (
        ArchSpec("gfx942", fp8=("fnuz",), usual_cu_num=304, warp_size=64, lds_bytes=64 * 1024, vgprs_per_simd=512,
                 hbm_gbps=5300, clock_mhz=2100),
        ArchSpec("gfx950", fp8=("fn",), usual_cu_num=256, warp_size=64, lds_bytes=160 * 1024, vgprs_per_simd=512,
                 hbm_gbps=8000, clock_mhz=2400),
        ArchSpec("sm_90", fp8=("fn",), usual_cu_num=132, warp_size=32, lds_bytes=227 * 1024),
        ArchSpec("cpu", fp8=("fn", "fnuz"), usual_cu_num=0),
    )
}

#: compute-unit count of each known arch's usual part (a view of :data:`ARCH_SPECS`)
USUAL_CU_NUM = {name: spec.usual_cu_num for name, spec in ARCH_SPECS.items()}


def native_fp8(arch: str) -> str:
    """The fp8 flavour inputs for ``arch`` are built in: its preferred native one; archs the
    table does not know compute in "fn" (OCP), as every chip after gfx942 does."""
    spec = ARCH_SPECS.get(arch)
    return spec.fp8[0] if spec is not None else "fn"


def native_fp8_dtype(arch: str) -> torch.dtype:
    return torch.float8_e4m3fnuz if native_fp8(arch) == "fnuz" else torch.float8_e4m3fn


def lds_limit(arch: str) -> int | None:
    """LDS / shared-memory bytes of ``arch`` (``None`` when unknown or absent)."""
    spec = ARCH_SPECS.get(arch)
    return spec.lds_bytes or None if spec is not None else None


def triton_target(arch: str):
    """Triton's ``GPUTarget`` for ``sm_90`` / ``gfx942`` / ``gfx950`` / ... (what the driver reports)."""
    arch = normalise_arch(arch)
    if arch.startswith("sm_"):
        return compiler.GPUTarget("cuda", int(arch[3:]), 32)
    if arch.startswith("gfx"):
        return compiler.GPUTarget("hip", arch, 64)
    raise ValueError(f"no Triton target for arch {arch!r} (expected sm_XX or gfxNNN)")


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
        spec = ARCH_SPECS.get(self.arch)
        return flavour in spec.fp8 if spec is not None else flavour == "fn"


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
        arch, _ = overrides()  # a bad value is reported wherever it is set, not only on GPU machines
        if arch is not None:
            _say_override_ignored(arch)
        return ArchInfo("cpu", 0)
    info = _detect_gpu(device.index if device.index is not None else torch.cuda.current_device())
    return apply_override(info)


@functools.lru_cache(maxsize=None)
def _say_override_ignored(arch: str) -> None:
    """Once per process and value: why the override does not apply to CPU tensors."""
    logging.getLogger("paged_mqa_logits").warning(
        "%s=%s is ignored for CPU tensors: they run as arch cpu, since no GPU kernel runs on them "
        "(python -m paged_mqa_logits explain --arch %s describes that chip)", ENV_ARCH, arch, arch)


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
        if not re.fullmatch(r"[0-9]+", text) or int(text) < 1:  # ASCII digits: str.isdigit takes "²"
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
