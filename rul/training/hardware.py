"""What this machine is, as far as training cares: its CPU's model, flags and usable cores
(read from Linux's /proc/cpuinfo, the one place rul reads it), and malloc's settings for a
training on a CPU. The choice of `precision: auto` is rul.training.precision's.
"""

import ctypes
import ctypes.util
import os
import platform

# glibc mallopt parameters (malloc.h) and the values keep_freed_memory sets
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_SETTINGS = ((_M_MMAP_THRESHOLD, 32 * 2**20),  # glibc's largest: blocks to 32 MiB from the heap
             (_M_TRIM_THRESHOLD, 2**30),  # free heap kept up to 1 GiB, not handed back
             (_M_TOP_PAD, 64 * 2**20))  # the heap grows 64 MiB at a time (address space only)
_kept = None
# CPU features that change which path `rul train` takes or how fast it runs.
NOTABLE_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpuinfo_field(name: str) -> str | None:
    """The first `name : value` of Linux's /proc/cpuinfo ("model name", "flags"); None where
    there is none (another OS)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else what platform knows."""
    return cpuinfo_field("model name") or platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The NOTABLE_CPU_FLAGS this CPU has (empty where /proc/cpuinfo is absent)."""
    flags = (cpuinfo_field("flags") or "").split()
    return [flag for flag in NOTABLE_CPU_FLAGS if flag in flags]


def usable_cpus() -> int:
    """The logical CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX-BF16). Without either,
    bf16 autocast is emulated and several times slower."""
    return bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags()))


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse (once per process; True if it did).

    A training step on a CPU allocates and frees the same few-MiB activation buffers over and
    over. By default glibc serves blocks of this size by mmap or hands freed heap back to the
    kernel (trim), so every step page-faults its buffers in again: thousands of faults per
    step of the default run (docs: Performance). With blocks up to 32 MiB taken from the heap, up
    to 1 GiB of free heap kept and the heap grown in large steps, the buffers are reused and
    the faults go away. The process keeps its peak resident memory instead of shrinking after
    it. Not glibc (macOS, musl): nothing changes, False. The memory probe's malloc_trim still
    hands free memory back before each measurement (memory.py).
    """
    global _kept
    if _kept is None:
        _kept = False
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):
            return _kept
        _kept = all([mallopt(parameter, value) for parameter, value in _SETTINGS])
    return _kept
