"""The machine a number was measured on, as flat strings: what a run's tags and a bench's JSON
record, so that every figure in the docs says where it came from.

Imports torch only (no mlflow, optuna or pydantic): the benches use it on machines that have
nothing else.
"""

import os
import platform

import torch

from rul.training.hardware import cpu_has_native_bf16, cpuinfo_field

# CPU features that change which path `rul train` takes or how fast it runs.
NOTABLE_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else what platform knows."""
    return cpuinfo_field("model name") or platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The NOTABLE_CPU_FLAGS this CPU has (empty where /proc/cpuinfo is absent)."""
    flags = (cpuinfo_field("flags") or "").split()
    return [flag for flag in NOTABLE_CPU_FLAGS if flag in flags]


def machine_tags() -> dict[str, str]:
    """cpu_model, cpu_flags, cpu_native_bf16, cpu_count (logical CPUs this process may use),
    torch_threads, gpu_name ("none" without CUDA) and torch_version."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 0
    return {"cpu_model": cpu_model(), "cpu_flags": " ".join(cpu_flags()) or "none",
            "cpu_native_bf16": str(cpu_has_native_bf16()).lower(),
            "cpu_count": str(usable), "torch_threads": str(torch.get_num_threads()),
            "gpu_name": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
            "torch_version": torch.__version__}
