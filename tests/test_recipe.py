"""`make train`'s recipe has one home, TrainConfig's defaults: what measures "the default
step" builds it from there. Move one value of the recipe (the kernel) and the precision probe's,
the benches' and `bench peers`' networks move with it."""

import importlib
from pathlib import Path

import pytest
import torch

from rul import config as cfg
from rul.plan import optimizer_settings, recipe_step
from rul.training.precision import Precision

MAKE_TRAIN = Path(__file__).resolve().parents[1] / "experiments" / "fd001.yaml"


@pytest.fixture
def kernel_of_9():
    """TrainConfig with another default kernel for the test's length: the recipe moved."""
    field = cfg.TrainConfig.model_fields["kernel_size"]
    before = field.default
    field.default = 9
    cfg.TrainConfig.model_rebuild(force=True)
    try:
        yield
    finally:
        field.default = before
        cfg.TrainConfig.model_rebuild(force=True)
        kernels()  # the benches' modules as the recipe is again


def kernels() -> dict[str, int]:
    import bench.memory
    import bench.speed
    from bench.peers.common import bench_config

    memory, speed = importlib.reload(bench.memory), importlib.reload(bench.speed)
    return {"probe": recipe_step().network.architecture["kernel_size"],
            "make train": cfg.load(MAKE_TRAIN).kernel_size,
            "bench memory": memory.RECIPE.network.architecture["kernel_size"],
            "bench speed": speed.RECIPE.network.architecture["kernel_size"],
            "bench speed's model": speed.default_model("default").backbone.features[0]
            .kernel_size[0],
            "bench peers": bench_config(1, dry=False, device="cpu").kernel_size}


def test_the_step_the_probe_and_the_benches_time_is_make_trains():
    recipe = cfg.TrainConfig()
    step = recipe_step()
    assert (step.optimization.kind, step.optimization.lr) == (recipe.optimizer, recipe.lr)
    assert step.network.architecture == recipe.architecture
    assert step.network.n_features == 14  # FD001's informative sensors: the sensors alone
    assert (step.effective_batch_size, step.micro_batch_size) == (512, 256)
    assert set(kernels().values()) == {recipe.kernel_size}
    for name in ("fp32", "bf16", "fp16"):  # the optimizer as training builds it per precision
        precision = Precision(torch.device("cpu"), name, use_scaler=False, reason="test")
        assert step.optimizer(precision) == optimizer_settings(recipe, precision)
    assert step.optimizer(precision).precision == "fp16"  # Muon's floor comes with it


def test_a_value_moved_in_the_recipe_moves_in_everything_that_measures_it(kernel_of_9):
    assert set(kernels().values()) == {9}
