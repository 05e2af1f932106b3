"""Device and mixed-precision policy: which autocast dtype, whether a GradScaler runs, and
what `precision: auto` picks and why."""

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.nn.utils import get_total_norm

from rul.errors import ConfigError
from rul.training import hardware

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
FP16_MAX = torch.finfo(torch.float16).max  # 65504


class EffectiveBatchScaler(torch.amp.GradScaler):
    """torch's GradScaler whose inf/NaN decision is the effective batch's, whatever its split.

    Under fp16 autocast each parameter's gradient passes through fp16 once per micro-batch,
    as the sum over that micro-batch's samples times the scale. A micro-batch of 512 samples
    overflows (65504) where two of 256 do not, so a stock scaler skips a step at 512 x 1 that
    it takes at 256 x 2, and from then on the splits train different models. Here the step is
    also skipped, and the scale halved, when the accumulated gradient times the scale exceeds
    fp16's largest value: when the effective batch as one micro-batch would have overflowed.
    At K = 1 that adds nothing (such a gradient is already inf); at K > 1 the splits skip the
    same steps and move the scale alike. Only one case still differs: micro-batches that
    overflow on their own while their sum does not (their gradients cancel by more than half).
    Everything runs on the device (no host sync); the state dict is GradScaler's.
    """

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        per_device = super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]
                 if p.grad is not None]
        for device, device_found_inf in per_device.items():
            here = [g for g in grads if g.device == device]
            if here:  # |unscaled grad| x scale > FP16_MAX  <=>  |unscaled grad| > FP16_MAX / scale
                largest = get_total_norm(here, norm_type=float("inf"), foreach=True)
                limit = inv_scale.to(device) * FP16_MAX
                overflow = (largest > limit).to(device_found_inf.dtype)
                torch.maximum(device_found_inf, overflow, out=device_found_inf)  # 0 or 1:
                # a fused optimizer skips only on found_inf == 1
        return per_device


@dataclass(frozen=True)
class Precision:
    device: torch.device
    name: str  # fp32 | fp16 | bf16
    use_scaler: bool  # fp16 only: bf16 has fp32's exponent range
    reason: str = "asked for"  # why this precision (logged as the run's precision.reason tag)

    @property
    def emulated(self) -> str | None:
        """One line when this precision is emulated on this device (bf16 on a CPU without
        AVX512-BF16 or AMX, fp16 on any CPU): the expected slow-down and the faster choice."""
        if self.device.type != "cpu" or self.name == "fp32":
            return None
        if self.name == "bf16" and hardware.cpu_has_native_bf16():
            return None
        slower = ("about 7x slower than fp32 (no AVX512-BF16 or AMX here)" if self.name == "bf16"
                  else "about 5x slower than fp32")
        return (f"precision={self.name} is emulated on this CPU: {slower}; precision=auto "
                f"picks the fastest that keeps the accuracy here")

    @property
    def said(self) -> str:
        """The line a training prints before it starts: the precision and why."""
        return f"precision {self.name}: {self.reason}"

    def autocast(self):
        if self.name == "fp32":
            return nullcontext()
        # A CUDA graph must not capture autocast's cache of cast weights (torch's CUDA graph
        # notes); each micro-batch's forward casts each weight once anyway.
        return torch.autocast(self.device.type, dtype=DTYPES[self.name],
                              cache_enabled=self.device.type != "cuda")

    def grad_scaler(self) -> torch.amp.GradScaler:
        # Disabled scaler: scale()/unscale_()/update() are no-ops and step() just steps.
        return EffectiveBatchScaler(self.device.type, enabled=self.use_scaler)


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda': no CUDA device is available here (use device=auto)")
    return torch.device(device)


def auto_precision(device: torch.device, model: str, probe: Callable | None = None
                   ) -> tuple[str, str]:
    """(precision, reason) of `precision: auto` for `model` on `device`: the fastest one known
    to keep accuracy there. A GPU of compute capability 8.0 or more (bf16 tensor cores): bf16
    autocast for the DCNN, measured the fastest there at fp32's 3-seed accuracy by `make
    gpu-check` (docs: Performance); fp16 + GradScaler, rul's reference AMP path, for the other
    models (not measured) and on older GPUs. A CPU with native bf16 (AVX512-BF16/AMX): for
    the DCNN, whose 5-seed accuracy in bf16 was measured against fp32 (docs: Performance), the
    faster of the two as `probe()` timed make train's step on this machine (rul.plan passes
    it: rul.training.cpu_probe); fp32 for the other models (not measured). A CPU without:
    fp32 (bf16 autocast is emulated there)."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major >= 8 and model == "cnn":
            return "bf16", (f"GPU of compute capability {major}.{minor} (>= 8.0): bf16 "
                            "autocast, the fastest for the DCNN at fp32's accuracy in make "
                            "gpu-check (docs: Performance)")
        why = (f"model={model}: bf16 measured for the DCNN only" if major >= 8 else
               f"compute capability {major}.{minor} < 8.0: no bf16 tensor cores")
        return "fp16", f"CUDA, {why}: fp16 autocast with a GradScaler"
    if not hardware.cpu_has_native_bf16():
        return "fp32", ("CPU without native bf16 (AVX512-BF16/AMX): bf16 autocast would be ~7x "
                        "slower")
    if model != "cnn":
        return "fp32", (f"CPU with native bf16: fp32 for model={model} (bf16's speed and "
                        "accuracy measured for the DCNN only; precision=bf16 opts in)")
    if probe is None:
        raise TypeError("auto_precision on a CPU with native bf16 needs the probe of make "
                        "train's step (rul.plan.cpu_measured)")
    found = probe()
    when = "measured now" if found.fresh else f"measured before, kept in {found.cache}"
    same = (" at the same 5-seed accuracy (docs: Performance)" if found.faster == "bf16"
            else "")
    return found.faster, (f"CPU with native bf16: make train's step on {found.machine} "
                          f"({when}): {found.figures()}; {found.faster} is the faster{same}")


def resolve_precision(precision: str, device: torch.device, model: str | None = None,
                      resumed: str | None = None, probe: Callable | None = None) -> Precision:
    """`auto` as auto_precision says for `model` (the config's model key: `auto` depends on it,
    so it has no default) with `probe`; an explicit precision is taken as asked.

    `resumed`: the precision a resumed run trained in (its checkpoint's). `auto` keeps it, so
    a run goes on as it started even where `auto` now picks another one (another machine, or
    another rul version): one run, one precision, and its precision.resolved tag stays true."""
    reason = "asked for"
    if precision == "auto" and model is None:
        raise TypeError("resolve_precision('auto', ...) needs the model: auto picks per model")
    if precision == "auto" and resumed is not None:
        chosen, _ = auto_precision(device, model, probe)
        reason = (f"resumed: the run trained in {resumed}" if chosen == resumed else
                  f"resumed: the run trained in {resumed} (auto would pick {chosen} here)")
        precision = resumed
    elif precision == "auto":
        precision, reason = auto_precision(device, model, probe)
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("precision='bf16': this GPU does not support bfloat16 (use auto)")
    return Precision(device, precision, use_scaler=precision == "fp16", reason=reason)
