"""What the hardware computes fast: the choice behind `precision: auto`.

No rul.config import (so no pydantic): `python -m bench speed` uses it on machines that have
only torch, numpy, pandas, scikit-learn, PyYAML and tqdm.
"""

import ctypes
import ctypes.util

import torch

# glibc mallopt parameters (malloc.h) and the values keep_freed_memory sets
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_SETTINGS = ((_M_MMAP_THRESHOLD, 32 * 2**20),  # glibc's largest: blocks to 32 MiB from the heap
             (_M_TRIM_THRESHOLD, 2**30),  # free heap kept up to 1 GiB, not handed back
             (_M_TOP_PAD, 64 * 2**20))  # the heap grows 64 MiB at a time (address space only)
_kept = None
# What `make gpu-check` measured for the default recipe before its study (100 epochs, 3 seeds;
# experiments/fd001_b512_e100.yaml), the figure `precision: auto`'s reason quotes on a GPU with
# bf16 tensor cores.
CUDA_BF16_MEASURED = ("the fastest for the DCNN at fp32's accuracy on an H200 (100-epoch recipe, "
                      "3 seeds: bf16 5.5 s, test RMSE 12.58; fp16 + GradScaler 8.4 s, 12.69; "
                      "fp32 9.0 s, 12.74)")


def cpuinfo_field(name: str) -> str | None:
    """The first `name : value` of Linux's /proc/cpuinfo ("model name", "flags"); None where
    there is none (another OS). The one place rul reads that file."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX-BF16; read from Linux's
    /proc/cpuinfo). Without either, bf16 autocast is emulated and several times slower."""
    flags = (cpuinfo_field("flags") or "").split()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def auto_precision(device: torch.device, model: str) -> tuple[str, str]:
    """(precision, reason) of `precision: auto` for `model` on `device`: the fastest one known
    to keep accuracy there. A GPU of compute capability 8.0 or more (bf16 tensor cores): bf16
    autocast for the DCNN, measured the fastest there at fp32's 3-seed accuracy by `make
    gpu-check` (docs: Performance); fp16 + GradScaler, rul's reference AMP path, for the other
    models (not measured) and on older GPUs. A CPU with native bf16 (AVX512-BF16/AMX): for
    the DCNN, whose 5-seed accuracy in bf16 was measured against fp32 (docs: Performance), the
    faster of the two as timed on this machine (rul.training.cpu_probe: once, then cached);
    fp32 for the other models (not measured). A CPU without: fp32 (bf16 autocast is emulated
    there, ~0.15x fp32's samples/s in `python -m bench speed`)."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major >= 8 and model == "cnn":
            return "bf16", (f"GPU of compute capability {major}.{minor} (>= 8.0): bf16 "
                            f"autocast, {CUDA_BF16_MEASURED} (docs: Performance)")
        why = (f"model={model}: bf16 measured for the DCNN only" if major >= 8 else
               f"compute capability {major}.{minor} < 8.0: no bf16 tensor cores")
        return "fp16", f"CUDA, {why}: fp16 autocast with a GradScaler"
    if not cpu_has_native_bf16():
        return "fp32", ("CPU without native bf16 (AVX512-BF16/AMX): bf16 autocast would be ~7x "
                        "slower")
    if model == "cnn":
        return _measured_cpu_precision()
    return "fp32", (f"CPU with native bf16: fp32 for model={model} (bf16's speed and accuracy "
                    "measured for the DCNN only; precision=bf16 opts in)")


def _measured_cpu_precision() -> tuple[str, str]:
    """The DCNN on a CPU with native bf16: fp32 or bf16, whichever ran the default step faster
    here (cpu_probe), the figures in the reason."""
    from rul.training.cpu_probe import measured

    found = measured()
    when = "measured now" if found.fresh else f"measured before, kept in {found.cache}"
    same = (" at the same 5-seed accuracy (docs: Performance)" if found.faster == "bf16"
            else "")
    return found.faster, (f"CPU with native bf16: the default step on {found.machine} "
                          f"({when}): {found.figures()}; {found.faster} is the faster{same}")


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
