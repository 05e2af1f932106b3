"""Peak memory of this process on a device, measured one way everywhere (the per-epoch
`peak_memory_mb` metric, the micro-batch probe, the tuning objective, the benches).

- CUDA: torch.cuda.max_memory_allocated after torch.cuda.reset_peak_memory_stats: the peak of
  torch's allocator, the figure that runs out first on a GPU.
- CPU: the process's resident set size, measured by the kernel: VmHWM, the high-water mark,
  which `reset_peak` moves down to the current size (freed heap handed back first with glibc's
  malloc_trim, then `5` into /proc/self/clear_refs). This counts every byte made resident
  (torch's CPU allocator, oneDNN scratch, Python objects), which tracemalloc cannot see. Needs
  Linux; elsewhere the CPU peak is ru_maxrss, which cannot be reset.
"""

import contextlib
import ctypes
import gc

import torch


def reset_peak(device: torch.device) -> int:
    """Start a fresh peak; returns the reading a step's peak counts from (CUDA: 0, peaks are
    absolute there; CPU: the resident set size now)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return 0
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    return _proc_kib("/proc/self/status", "VmRSS:") or _maxrss()


def peak_bytes(device: torch.device) -> int:
    """The peak since the last reset (CUDA: allocated by torch; CPU: resident set)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return _proc_kib("/proc/self/status", "VmHWM:") or _maxrss()


def peak_memory_mb(device: torch.device) -> float:
    return peak_bytes(device) / 2**20


def available_bytes() -> int | None:
    """The memory the kernel says is available now (Linux's MemAvailable), or None."""
    return _proc_kib("/proc/meminfo", "MemAvailable:")


def _proc_kib(path: str, key: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _maxrss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
