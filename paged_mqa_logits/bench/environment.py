"""The machine a benchmark runs on: device, versions, and the copy bandwidth measured in the same
run (every bandwidth figure is a fraction of it)."""

from __future__ import annotations

import datetime
import statistics
import time
from dataclasses import dataclass

import torch

from ..arch import detect


@dataclass
class Environment:
    device: str
    gpu: str
    arch: str
    cu_num: int
    l2_bytes: int
    triton: str
    torch: str
    cuda: str
    date: str
    copy_gbps: float

    def header_lines(self, command: str | None = None) -> list[str]:
        lines = [
            f"# gpu: {self.gpu}",
            f"# arch: {self.arch}, {'SMs' if self.arch.startswith('sm_') else 'CUs'}: {self.cu_num}, "
            f"L2: {self.l2_bytes / 2**20:.0f} MiB",
            f"# versions: triton {self.triton}, torch {self.torch}, {self.cuda}",
            f"# date: {self.date}",
            f"# copy_bandwidth_GBps: {self.copy_gbps:.0f} (device-to-device copy, read + write, same run)",
            "# method: docs/BENCHMARK.md -- rotating make_inputs copies past L2, warm-up outside capture, "
            "median of CUDA-graph replays / calls; bytes = KV (D+4 per walked token; D/2+4 in fp4) + logits "
            "written (4 bytes each; 2 in bf16)",
        ]
        if command:
            lines.append(f"# command: {command}")
        return lines


def _versions() -> tuple[str, str, str]:
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # triton is a dependency, but the bench must still describe a broken install
        triton_version = "none"
    if torch.version.hip:
        accel = f"hip {torch.version.hip}"
    elif torch.version.cuda:
        accel = f"cuda {torch.version.cuda}"
    else:
        accel = "cpu build"
    return triton_version, torch.__version__, accel


def copy_bandwidth(device: str | torch.device, nbytes: int | None = None, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + bytes written, median of repeats)."""
    dev = torch.device(device)
    nbytes = nbytes or ((1 << 30) if dev.type == "cuda" else (64 << 20))
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    src.fill_(1)
    dst = torch.empty_like(src)
    # Warm up long enough for an idle GPU to reach its clocks: a single copy measured right
    # after idling reads ~10% low (3.7 vs 4.2 TB/s seen on the H200).
    for _ in range(10 if dev.type == "cuda" else 1):
        dst.copy_(src)
    seconds = []
    for _ in range(repeats):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            seconds.append(time.perf_counter() - t0)
    del src, dst
    return 2 * nbytes / statistics.median(seconds) / 1e9


def l2_bytes(device: str | torch.device) -> int:
    """The GPU's L2 size (50 MiB where the driver does not report it)."""
    return int(getattr(torch.cuda.get_device_properties(torch.device(device)), "L2_cache_size", 0) or 50 << 20)


def environment(device: str | torch.device) -> Environment:

    dev = torch.device(device)
    info = detect(dev)
    triton_version, torch_version, accel = _versions()
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        gpu, l2 = props.name, l2_bytes(dev)
    else:
        gpu, l2 = "cpu", 0
    return Environment(
        device=str(dev), gpu=gpu, arch=info.arch, cu_num=info.cu_num, l2_bytes=l2, triton=triton_version,
        torch=torch_version, cuda=accel, date=datetime.date.today().isoformat(), copy_gbps=copy_bandwidth(dev),
    )
