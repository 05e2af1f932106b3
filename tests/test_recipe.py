"""`make train`'s recipe has one home, TrainConfig's defaults: what measures "the default
step" builds it from there. Move one value of the recipe (the kernel) and the precision probe's,
the benches' and `bench peers`' networks move with it."""

import importlib
import shlex
from pathlib import Path

import pytest
import torch

from rul import config as cfg
from rul.config.recipes import recipe_files, train_command
from rul.plan import optimizer_settings, recipe_step
from rul.training.precision import Precision

ROOT = Path(__file__).resolve().parents[1]
MAKE_TRAIN = ROOT / "experiments" / "fd001.yaml"


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


def _trained_again(command: str, data_dir: str) -> cfg.TrainConfig:
    """The config `rul train ...` (as a shell splits it) would train, its data where it was."""
    rul, train, file, *overrides = shlex.split(command)
    assert (rul, train) == ("rul", "train") and file.startswith("experiments/"), command
    return cfg.load(ROOT / file, [*overrides, f"data_dir={data_dir}"])


@pytest.mark.parametrize("path", recipe_files(), ids=lambda p: p.name)
def test_the_reproduce_command_trains_each_recipe_again(path, tmp_path):
    """Each recipe with its seed, a list value and a value with a space moved: the command
    names that recipe (or a closer one) and the keys that differ, and trains the same config."""
    moved = {"seed": 7, "val_fraction": 0.25}
    config = cfg.load(path, [f"data_dir={tmp_path}"]).model_copy(update=moved)
    if config.data is not None:  # a fleet: a list, a pattern and a name with a space
        data = config.data.model_copy(update={"settings": ["alt itude", "mach"],
                                              "sensors": ["T*", "P 2"]})
        config = config.model_copy(update={"data": data})
    command = train_command(config)
    assert "seed=7" in command and "val_fraction=0.25" in command, command
    assert _trained_again(command, str(tmp_path)) == config, command


def test_the_reproduce_command_names_the_recipe_a_config_was_loaded_from(tmp_path):
    config = cfg.load(MAKE_TRAIN.parent / "fd001_age.yaml", [f"data_dir={tmp_path}"])
    assert train_command(config) == "rul train experiments/fd001_age.yaml"
    assert train_command(config.model_copy(update={"epochs": 3})) == (
        "rul train experiments/fd001_age.yaml epochs=3")
