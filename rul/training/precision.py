"""Device and mixed-precision policy: which autocast dtype, and whether a GradScaler runs."""

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from rul.errors import ConfigError
from rul.training.hardware import auto_precision

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Precision:
    device: torch.device
    name: str  # fp32 | fp16 | bf16
    use_scaler: bool  # fp16 only: bf16 has fp32's exponent range
    reason: str = "asked for"  # why this precision (logged as the run's precision.reason tag)

    def autocast(self):
        if self.name == "fp32":
            return nullcontext()
        return torch.autocast(self.device.type, dtype=DTYPES[self.name])

    def grad_scaler(self) -> torch.amp.GradScaler:
        # Disabled scaler: scale()/unscale_()/update() are no-ops and step() just steps.
        return torch.amp.GradScaler(self.device.type, enabled=self.use_scaler)


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda': no CUDA device is available here (use device=auto)")
    return torch.device(device)


def resolve_precision(precision: str, device: torch.device, model: str | None = None,
                      resumed: str | None = None) -> Precision:
    """`auto` as auto_precision says for `model` (the config's model key: `auto` depends on it,
    so it has no default); an explicit precision is taken as asked.

    `resumed`: the precision a resumed run trained in (its checkpoint's). `auto` keeps it, so
    a run goes on as it started even where `auto` now picks another one (another machine, or
    another rul version): one run, one precision, and its precision.resolved tag stays true."""
    reason = "asked for"
    if precision == "auto" and model is None:
        raise TypeError("resolve_precision('auto', ...) needs the model: auto picks per model")
    if precision == "auto" and resumed is not None:
        chosen, _ = auto_precision(device, model)
        reason = (f"resumed: the run trained in {resumed}" if chosen == resumed else
                  f"resumed: the run trained in {resumed} (auto would pick {chosen} here)")
        precision = resumed
    elif precision == "auto":
        precision, reason = auto_precision(device, model)
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("precision='bf16': this GPU does not support bfloat16 (use auto)")
    return Precision(device, precision, use_scaler=precision == "fp16", reason=reason)
