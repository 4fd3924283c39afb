"""Where GPU code runs, and what it ran on.

`require_cuda()` is the one gate of every GPU command: without torch, triton or a CUDA device
it raises `GPUUnavailableError`, which the CLI turns into one line and exit code 2.
`device_info()` is the block of facts put beside every measured number (DESIGN.md section 5,
item 11): GPU name, SM count, memory, driver, CUDA, torch and triton versions, date.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import shutil
import subprocess
from typing import Any

from pagesim.errors import ConfigError, GPUUnavailableError

#: dtype names accepted by `--dtype` (vLLM's spellings), mapped to torch attribute names.
DTYPES: dict[str, str] = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
}


def cuda_driver_devices() -> int | None:
    """CUDA devices the driver sees, asked through libcuda itself (milliseconds, where
    importing torch takes seconds to tens of seconds): 0 without a driver or device, None
    when the answer is unknown (libcuda loaded but the query is unavailable)."""
    import ctypes
    import ctypes.util

    names = ["libcuda.so.1", "libcuda.so", ctypes.util.find_library("cuda"), "nvcuda.dll"]
    for name in [n for n in names if n]:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        try:
            if lib.cuInit(0) != 0:
                return 0
            count = ctypes.c_int(0)
            return count.value if lib.cuDeviceGetCount(ctypes.byref(count)) == 0 else 0
        except AttributeError:
            return None
    return 0


def require_cuda(hint: str = "") -> None:
    """Raise `GPUUnavailableError` unless torch, triton and a CUDA device are present.

    The driver is asked first (`cuda_driver_devices`), so a machine without a GPU hears so
    at once rather than after torch's import; `hint` ends the message (what works instead)."""
    if cuda_driver_devices() == 0:
        raise GPUUnavailableError(
            f"this command needs a CUDA GPU; the CUDA driver finds none on this machine{hint}"
        )
    for module in ("torch", "triton"):
        if importlib.util.find_spec(module) is None:
            raise GPUUnavailableError(
                f"this command needs a CUDA GPU with torch and triton; {module} is not "
                f"installed{hint}"
            )
    import torch

    if not torch.cuda.is_available():
        raise GPUUnavailableError(
            "this command needs a CUDA GPU; torch.cuda.is_available() is False on this "
            f"machine{hint}"
        )


def torch_dtype(name: str):
    """The torch dtype for a `--dtype` name; one-line `ConfigError` on a miss."""
    import torch

    key = name.lower()
    if key not in DTYPES:
        raise ConfigError(f"dtype={name!r}: choose one of {', '.join(sorted(DTYPES))}")
    return getattr(torch, DTYPES[key])


def device_info(device: Any = None) -> dict[str, Any]:
    """Facts about the device and software stack, for profile metadata and result files."""
    import torch
    import triton

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda or "",
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    if torch.cuda.is_available():
        dev = torch.device(device or "cuda")
        props = torch.cuda.get_device_properties(dev)
        free, total = torch.cuda.mem_get_info(dev)
        info.update(
            gpu_name=props.name,
            num_sms=props.multi_processor_count,
            memory_total_bytes=int(total),
            memory_free_bytes_at_start=int(free),
            compute_capability=f"{props.major}.{props.minor}",
            l2_cache_bytes=int(getattr(props, "L2_cache_size", 0)),
            driver=_driver_version(),
        )
    else:
        info.update(gpu_name="cpu", num_sms=0, driver="")
    return info


def _driver_version() -> str:
    """The NVIDIA driver version from nvidia-smi, or "" where it cannot be read."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ""
    try:
        out = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""


class ClockSampler:
    """Samples the GPU's SM clock (MHz, through NVML) every `interval_s` on a thread.

    Diagnostic only: a launch-bound step's time depends on the clock the driver picked, so a
    real run or a calibration keeps the clock trace beside its timings. Without NVML (or on a
    CPU) it records nothing. Use as a context manager; `samples` holds (seconds, MHz).
    """

    def __init__(self, interval_s: float = 0.05) -> None:
        import threading

        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self):
        import torch

        try:
            return int(torch.cuda.clock_rate())
        except Exception:  # no NVML binding, or no GPU: nothing to sample
            return None

    def _run(self) -> None:
        import time

        t0 = time.perf_counter()
        while not self._stop.is_set():
            mhz = self._read()
            if mhz is None:
                return
            self.samples.append((time.perf_counter() - t0, mhz))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> ClockSampler:
        import torch

        if torch.cuda.is_available():
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)

    def summary(self) -> dict[str, float | int]:
        mhz = [m for _, m in self.samples]
        if not mhz:
            return {"num_samples": 0}
        return {
            "num_samples": len(mhz),
            "mean_mhz": sum(mhz) / len(mhz),
            "min_mhz": min(mhz),
            "max_mhz": max(mhz),
            "frac_below_1500_mhz": sum(m < 1500 for m in mhz) / len(mhz),
        }
