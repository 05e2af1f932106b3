"""rul's own loop: `rul train`'s plan and `rul.training.engine.fit`, untracked (what `rul train`
runs between preparing the data and predicting the test units). Its listener takes the next
turn after each epoch but the last (bench/peers/common.py, Baton)."""

from bench.peers.common import Setup, measured


def train(setup: Setup) -> dict:
    from rul.plan import plan_run
    from rul.training.engine import fit
    from rul.training.listener import TrainingListener

    class Turns(TrainingListener):
        def on_epoch(self, epoch, step, metrics):
            if epoch < setup.config.epochs:
                setup.baton.turn()

    model = setup.model()
    setup.baton.turn()
    started = setup.start()
    plan = plan_run(setup.config, data=setup.data)  # on a CPU: malloc's settings, as rul train
    state = fit(model, plan, Turns(), progress=False)
    wall = setup.seconds_since(started)
    per_epoch = len(setup.data.train)
    epoch_seconds = [per_epoch / h["samples_per_s"] for h in state.history]
    # fit returns its best epoch's weights; the figure every loop reports is its last epoch's
    return measured(setup, wall, epoch_seconds, state.history[-1]["val_rmse"])
