"""`python -m bench members`: an ensemble's members trained at once (rul.training.stacked)
against one member trained alone, on the device at hand, the default recipe's network in
fp32 with AdamW (what stacks).

  time       N members stacked vs one member alone, same epochs: the ratio (the GPU's target:
             5 members <= 1.5x one; on a CPU the arithmetic, not the launches, sets the time)
  against    the same members one after another, in fp32 and at precision auto (what
             `ensemble_training: auto` trains today): stacking pays where it beats the latter
  exactness  with dropout 0 (dropout's masks are other draws when stacked) and TF32 off (on
             a GPU it rounds every fp32 product of either run to 10 bits), each member's
             gradient norm over its first 10 steps of one epoch against the same member
             trained alone: the largest relative difference (later steps part further, as
             two roundings of any one training do)

Untracked (no mlflow): what is timed is the training, not its logging.
"""

import contextlib
import time

import numpy as np
import torch

from bench.__main__ import DEFAULT, _summary

FIRST_STEPS = 10
# The default recipe's network as members stack (rul.training.stacked.stacking_problem): fp32,
# AdamW (Muon, the default recipe's optimizer, orthogonalises each member's matrices, not the
# stack of them), dropout 0 (stacked members draw other masks); untracked.
STACKABLE = {"optimizer": "adamw", "dropout": 0.0, "precision": "fp32",
             "interval_coverage": None, "register": False}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def full_fp32():
    """fp32 products in full fp32 on CUDA (TF32 off for cuBLAS and cuDNN), as on a CPU."""
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


def first_steps_difference(config, subset=None) -> float:
    """The largest relative difference of a stacked member's gradient norm from the same
    member's trained alone, over its first FIRST_STEPS steps (one epoch, TF32 off)."""
    from rul.plan import plan_ensemble
    from rul.training.run import train
    from rul.training.stacked import train_members

    plans = plan_ensemble(config.replace(epochs=1), subset).members
    with full_fp32():
        stacked = train_members(plans)
        alone = [train(plan, progress=False) for plan in plans]
    worst = 0.0
    for a, s in zip(alone, stacked, strict=True):
        x = np.asarray(a.state.grad_norms[:FIRST_STEPS])
        y = np.asarray(s.state.grad_norms[:FIRST_STEPS])
        worst = max(worst, float(np.max(np.abs(x - y) / np.abs(x))))
    return worst


def measure_members(config, subset=None) -> dict:
    """Seconds of one member alone and of config.ensemble members stacked, and the largest
    relative per-step difference of stacked members from alone ones (needs dropout 0 to be
    small)."""
    from rul.plan import plan_ensemble
    from rul.training.run import train
    from rul.training.stacked import stacking_problem, train_members

    plans = plan_ensemble(config, subset).members
    problem = stacking_problem(plans)
    if problem is not None:
        raise ValueError(f"members cannot train stacked: {problem}")
    device = plans[0].device
    train(plans[0], progress=False)  # warm-up: first-use work of the device and allocator
    _sync(device)
    started = time.perf_counter()
    train(plans[0], progress=False)
    _sync(device)
    one = time.perf_counter() - started
    started = time.perf_counter()
    train_members(plans)
    _sync(device)
    together = time.perf_counter() - started
    started = time.perf_counter()
    for plan in plans[1:]:
        train(plan, progress=False)
    _sync(device)
    sequential = one + time.perf_counter() - started
    auto = plan_ensemble(config.replace(precision="auto"), subset).members
    started = time.perf_counter()  # what ensemble_training: auto trains today
    for plan in auto:
        train(plan, progress=False)
    _sync(device)
    at_auto = time.perf_counter() - started
    worst = first_steps_difference(config, subset)
    return {"members": len(plans), "one alone (s)": round(one, 2),
            "stacked (s)": round(together, 2), "ratio": round(together / one, 2),
            "one after another (s)": round(sequential, 2),
            "one after another at auto (s)": round(at_auto, 2),
            "auto precision": auto[0].precision.name,
            "worst relative difference": float(f"{worst:.2e}"),
            "device": str(device), "precision": plans[0].precision.name}


def bench_members(members: int = 5, epochs: int = 3) -> dict:
    from rul import config as cfg

    config = cfg.load(DEFAULT, {"ensemble": members, "epochs": epochs, **STACKABLE})
    measured = measure_members(config)
    print(f"members: {members} stacked {measured['stacked (s)']:.1f} s vs one alone "
          f"{measured['one alone (s)']:.1f} s -> ratio {measured['ratio']:.2f} ({epochs} epochs, "
          f"{measured['device']} {measured['precision']}, {torch.get_num_threads()} threads; "
          f"GPU target <= 1.5); one after another {measured['one after another (s)']:.1f} s "
          f"(fp32), {measured['one after another at auto (s)']:.1f} s (auto: "
          f"{measured['auto precision']}); first {FIRST_STEPS} steps' gradient norms vs alone "
          f"within "
          f"{measured['worst relative difference']:.1e} (dropout 0)")
    return _summary(measured)
