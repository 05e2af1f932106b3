"""A plain loop as nanoGPT's train.py writes one: per optimizer step, K micro-batches each
with its loss / K under the precision's autocast, a GradScaler (enabled for fp16 only),
unscale, clip, step, update, zero_grad(set_to_none=True); torch's cosine schedule; the
validation RMSE after each epoch. (nanoGPT runs a CPU without autocast; here the precision is
rul's, bf16 autocast on a CPU with native bf16.)"""

import torch

from bench.peers.common import EpochClock, Setup, last_val_rmse, measured


def train(setup: Setup) -> dict:
    config, device = setup.config, setup.device
    model = setup.model()
    setup.baton.turn()
    started = setup.start()
    windows = setup.batches("train")
    optimizer = setup.optimizer(model)
    schedule = setup.schedule(optimizer)
    scaler = torch.amp.GradScaler(device.type, enabled=setup.precision.name == "fp16")
    k, clock = config.accumulation_steps, EpochClock(device)
    for epoch in range(config.epochs):
        if epoch:
            setup.baton.turn()
        model.train()
        clock.start()
        for micro_batches in setup.effective_batches(epoch):
            for index in micro_batches:
                x, y = windows.get(index)
                with setup.precision.autocast():
                    loss = setup.loss(model, x, y) / k
                scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            schedule.step()
        clock.stop()
        val_rmse = last_val_rmse(setup, model)  # each epoch's validation, as every loop's
    return measured(setup, setup.seconds_since(started), clock.seconds, val_rmse)
