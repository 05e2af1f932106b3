"""rul's own loop: `rul train`'s plan and `rul.training.engine.fit`, untracked (what `rul train`
runs between preparing the data and predicting the test units)."""

import time

from bench.peers.common import Setup, measured


def train(setup: Setup) -> dict:
    from rul.plan import plan_run
    from rul.training.engine import fit

    model = setup.model()
    started = time.perf_counter()
    plan = plan_run(setup.config, data=setup.data)  # on a CPU: malloc's settings, as rul train
    state = fit(model, plan, progress=False)
    wall = time.perf_counter() - started
    per_epoch = len(setup.data.train)
    epoch_seconds = [per_epoch / h["samples_per_s"] for h in state.history]
    # fit returns its best epoch's weights; the figure every loop reports is its last epoch's
    return measured(setup, wall, epoch_seconds, state.history[-1]["val_rmse"])
