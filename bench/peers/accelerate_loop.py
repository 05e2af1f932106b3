"""Hugging Face Accelerate's loop, as its gradient-accumulation guide writes it: an
`Accelerator(gradient_accumulation_steps=K, mixed_precision=...)` matching rul's precision
("no", "bf16" or "fp16"), the model, optimizer, DataLoader and cosine schedule prepared, each
micro-batch under `accelerator.accumulate(model)` with `accelerator.backward`,
`clip_grad_norm_` when the gradients are synced, and `step`/`zero_grad` called every
micro-batch (Accelerate skips them between syncs); the validation RMSE after each epoch.
Accelerate divides each micro-batch's loss by K and syncs at the end of the DataLoader."""

import torch

from bench.peers.common import EpochClock, MicroBatches, Setup, last_val_rmse, measured

MIXED_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}


def train(setup: Setup) -> dict:
    from accelerate import Accelerator

    config, device = setup.config, setup.device
    model = setup.model()
    setup.baton.turn()
    started = setup.start()
    accelerator = Accelerator(gradient_accumulation_steps=config.accumulation_steps,
                              mixed_precision=MIXED_PRECISION[setup.precision.name],
                              cpu=device.type == "cpu")
    micro, clock = MicroBatches(setup), EpochClock(device)
    optimizer = setup.optimizer(model)
    loader = torch.utils.data.DataLoader(micro, batch_size=None, shuffle=False)
    model, optimizer, loader, schedule = accelerator.prepare(model, optimizer, loader,
                                                             setup.schedule(optimizer))
    for epoch in range(config.epochs):
        if epoch:
            setup.baton.turn()
        micro.set_epoch(epoch)
        model.train()
        clock.start()
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(setup.loss(model, x, y))
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                optimizer.step()
                schedule.step()
                optimizer.zero_grad(set_to_none=True)
        clock.stop()
        last_val_rmse(setup, model)  # each epoch's validation (in the prepared precision)
    wall = setup.seconds_since(started)
    final = accelerator.unwrap_model(model, keep_fp32_wrapper=False)  # float32, as rul's
    return measured(setup, wall, clock.seconds, last_val_rmse(setup, final))
