"""PyTorch Lightning's loop: a LightningModule around the same network, `Trainer.fit` with
`accumulate_grad_batches=K`, `gradient_clip_val`, the precision matching rul's
("32-true", "bf16-mixed" or "16-mixed"), the cosine schedule stepped per optimizer step, and a
validation loop after each epoch. No logger, checkpointing, progress bar or sanity check:
rul's loop here does none of those either. Lightning divides each micro-batch's loss by K and
steps on the epoch's last micro-batch even when its accumulation is short."""

import logging
import warnings

import torch

from bench.peers.common import EpochClock, MicroBatches, Setup, last_val_rmse, measured

PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


def _module(setup: Setup, model, micro: MicroBatches, clock: EpochClock):
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            x, y = batch
            return setup.loss(self.model, x, y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            return (self.model(x).float() - y).square().sum()

        def on_train_epoch_start(self):
            if self.current_epoch:
                setup.baton.turn()
            micro.set_epoch(self.current_epoch)
            clock.start()

        def on_validation_epoch_start(self):
            clock.stop()  # after the epoch's last optimizer step

        def configure_optimizers(self):
            optimizer = setup.optimizer(self.model)
            return {"optimizer": optimizer,
                    "lr_scheduler": {"scheduler": setup.schedule(optimizer), "interval": "step"}}

    return Module()


class InOrder(torch.utils.data.Dataset):
    """A split's windows in order, 4096 a batch (as rul validates)."""

    def __init__(self, windows, size: int = 4096):
        self.windows, self.chunks = windows, torch.arange(len(windows)).split(size)

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, i: int):
        return self.windows.get(self.chunks[i].to(self.windows.starts.device))


def train(setup: Setup) -> dict:
    import lightning as L

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="lightning")
    config, device = setup.config, setup.device
    model = setup.model()
    setup.baton.turn()
    started = setup.start()
    micro, clock = MicroBatches(setup), EpochClock(device)
    loader = torch.utils.data.DataLoader(micro, batch_size=None, shuffle=False)
    val = torch.utils.data.DataLoader(InOrder(setup.batches("val")), batch_size=None)
    trainer = L.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=1,
                        max_epochs=config.epochs, precision=PRECISION[setup.precision.name],
                        accumulate_grad_batches=config.accumulation_steps,
                        gradient_clip_val=config.max_grad_norm, gradient_clip_algorithm="norm",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(_module(setup, model, micro, clock), loader, val)
    wall = setup.seconds_since(started)
    return measured(setup, wall, clock.seconds, last_val_rmse(setup, model))
