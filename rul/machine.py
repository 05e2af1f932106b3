"""The machine a number was measured on, as flat strings: what a run's tags and a bench's JSON
record, so that every figure in the docs says where it came from.

Imports torch only (no mlflow, optuna or pydantic): the benches use it on machines that have
nothing else.
"""

import torch

from rul.training.hardware import cpu_flags, cpu_has_native_bf16, cpu_model, usable_cpus


def machine_tags() -> dict[str, str]:
    """cpu_model, cpu_flags, cpu_native_bf16, cpu_count (logical CPUs this process may use),
    torch_threads, gpu_name ("none" without CUDA) and torch_version."""
    return {"cpu_model": cpu_model(), "cpu_flags": " ".join(cpu_flags()) or "none",
            "cpu_native_bf16": str(cpu_has_native_bf16()).lower(),
            "cpu_count": str(usable_cpus()), "torch_threads": str(torch.get_num_threads()),
            "gpu_name": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
            "torch_version": torch.__version__}
