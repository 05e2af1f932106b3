"""What the hardware computes fast: the choice behind `precision: auto`.

No rul.config import (so no pydantic): `python -m bench speed` uses it on machines that have
only torch, numpy, pandas, scikit-learn, PyYAML and tqdm.
"""

import torch


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX-BF16; read from Linux's
    /proc/cpuinfo). Without either, bf16 autocast is emulated and several times slower."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def auto_precision(device: torch.device) -> tuple[str, str]:
    """(precision, reason) of `precision: auto` on `device`: the fastest one known to keep
    accuracy there. CUDA: fp16 autocast + GradScaler (tensor cores on every CUDA GPU; the
    scaler keeps small gradients). CPU: fp32. bf16 autocast on a CPU without native bf16 runs
    ~0.15x fp32's samples/s (`python -m bench speed`); on one with native bf16 it is faster
    but its accuracy has not been measured for this model yet, so it stays an opt-in."""
    if device.type == "cuda":
        return "fp16", "CUDA: fp16 autocast with a GradScaler is the fastest safe choice"
    if cpu_has_native_bf16():
        return "fp32", ("CPU with native bf16: fp32 until bf16's accuracy is measured for this "
                        "model (precision=bf16 opts in)")
    return "fp32", "CPU without native bf16 (AVX512-BF16/AMX): bf16 autocast would be ~7x slower"
