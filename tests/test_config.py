"""The typed configs: TrainConfig (`rul train`) and TuningConfig (`rul tune`), their defaults,
rules and one-line error messages."""

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rul import config as cfg
from rul.cli import main

ROOT = Path(__file__).resolve().parents[1]
TRAIN_PATH = ROOT / "experiments" / "fd001.yaml"
TUNE_PATH = ROOT / "experiments" / "tune_fd001.yaml"

# TrainConfig's defaults before they became `make train`'s recipe (the AdamW era): what the
# historic configs of experiments/ were measured with, and pin to keep their meaning.
OLD_FD001 = {
    "subset": "FD001", "data_dir": None, "window": 30, "rul_cap": 125,
    "features": "informative", "include_settings": False, "drop_constant": False,
    "normalization": "minmax", "condition_scaling": "auto", "smoothing_alpha": 0.1,
    "val_fraction": 0.2, "model": "cnn", "hidden_size": 100, "num_layers": 4, "dropout": 0.5,
    "kernel_size": 10, "filters": 10, "num_heads": 4, "micro_batch_size": 256,
    "accumulation_steps": 2, "epochs": 100, "lr": 0.002, "weight_decay": 0.0,
    "scheduler": "cosine", "max_grad_norm": 1.0, "ema_decay": 0.99, "precision": "auto",
    "seed": 42, "deterministic": False, "patience": 20, "device": "auto", "tracking_uri": None,
    "experiment": None, "register": True, "run_name": None,
    "checkpoint_dir": "mlruns/checkpoints",
    "interval_coverage": 0.9,  # not part of the run's digest: same checkpoint id as before
}


def train_error(override) -> str:
    overrides = override if isinstance(override, list | dict) else [override]
    with pytest.raises(cfg.ConfigError) as error:
        cfg.load(TRAIN_PATH, overrides)
    return str(error.value)


def tune_error(changes: dict) -> str:
    with pytest.raises(cfg.ConfigError) as error:
        cfg.load_tuning(TUNE_PATH, changes)
    return str(error.value)


# ---------------------------------------------------------------- defaults


# `make train`'s recipe, as TrainConfig's defaults hold it (and nothing else states it).
RECIPE = {**OLD_FD001, "patience": 40, "optimizer": "muon", "lr": 0.0148, "dropout": 0.746,
          "hidden_size": 50, "kernel_size": 14, "warmup_epochs": 1, "epochs": 35,
          "ema_decay": 0.998, "train_sampling": "truncation"}


def test_the_defaults_are_make_trains_recipe_with_the_types_runs_were_tracked_with():
    for config in (cfg.TrainConfig(), cfg.load(), cfg.load(TRAIN_PATH)):
        values = config.to_dict()
        assert values == RECIPE
        assert {k: type(v) for k, v in values.items()} == {
            k: type(v) for k, v in RECIPE.items()}  # 0.0 stays a float: same checkpoint id


def test_a_fleets_config_trains_make_trains_recipe():
    """experiments/fleet.yaml (and its study's base) describe a data set and nothing else:
    every training key is the recipe's, Muon included."""
    for config in (cfg.load(ROOT / "experiments" / "fleet.yaml"),
                   cfg.load_tuning(ROOT / "experiments" / "tune_fleet.yaml").train):
        written = config.to_dict()
        assert written.pop("data")["name"] == "fleet"
        assert written == {k: v for k, v in RECIPE.items() if k != "subset"}


def test_a_key_added_later_is_written_only_when_it_differs_from_what_runs_had_before_it():
    """Not from today's default: an AdamW run (before `optimizer` existed) keeps its params and
    digest, and is rebuilt from them as AdamW, though the default is Muon."""
    from rul.config.training import with_legacy_values

    adamw = cfg.load(None, ["optimizer=adamw", "train_sampling=windows", "warmup_epochs=0"])
    assert not {"optimizer", "train_sampling", "warmup_epochs"} & set(adamw.to_dict())
    assert cfg.build(with_legacy_values(adamw.to_dict())) == adamw
    assert adamw.replace(seed=7).optimizer == "adamw"
    assert cfg.TrainConfig().to_dict()["optimizer"] == "muon"  # stated: it differs from before


def test_make_train_is_the_studied_recipe_and_the_age_recipe_adds_the_age_to_it():
    """make train reads the sensors alone (a late-starting record costs the age model more
    than it gains) with Muon and the rate, dropout, head width and kernel its studies chose,
    its training windows drawn as test histories are cut off, for the 35 epochs validation
    chose with that draw;
    experiments/fd001_age.yaml is that recipe with the engine's age;
    experiments/fd001_b512_adamw.yaml keeps the AdamW recipe its study chose before, and
    experiments/fd001_b512_e100.yaml the recipe before that study."""
    from rul.data.dataset import Dataset
    from rul.plan import data_settings
    from rul.preprocessing.choices import DataChoices
    from rul.preprocessing.prepared import preprocessor_for

    fd001 = Dataset("FD001", None, None, None, {})
    choices = DataChoices(1, "", ["s_2"], "")
    previous = {**OLD_FD001, "patience": 40}
    adamw = {**previous, "lr": 0.0108, "warmup_epochs": 1, "epochs": 150, "ema_decay": 0.998}
    muon = RECIPE
    assert cfg.load(TRAIN_PATH).to_dict() == muon
    recipe = data_settings(cfg.load(TRAIN_PATH))
    assert preprocessor_for(recipe, fd001, choices).include_cycle is False
    assert cfg.load(ROOT / "experiments" / "fd001_b512_adamw.yaml").to_dict() == adamw
    assert cfg.load(ROOT / "experiments" / "fd001_b512_e100.yaml").to_dict() == previous
    age = cfg.load(ROOT / "experiments" / "fd001_age.yaml")
    assert age.to_dict() == {**muon, "include_cycle": True}
    assert preprocessor_for(data_settings(age), fd001, choices).include_cycle is True


def test_a_one_epoch_try_of_make_train_is_all_warm_up_not_an_error():
    """`make train ARGS="epochs=1"`: the recipe's 1-epoch warm-up fills the run."""
    short = cfg.load(TRAIN_PATH, ["epochs=1"])
    assert (short.epochs, short.warmup_epochs) == (1, 1)


def test_no_config_file_restates_a_default():
    """The recipe's one home is TrainConfig: a file that restated a default would keep the old
    value when the recipe moves. A historic config pins only what differs from today's
    defaults (and the tests above pin what it resolves to)."""
    defaults = cfg.TrainConfig().model_dump()
    tuning_defaults = cfg.TuningConfig().to_dict()
    paths = sorted((ROOT / "experiments").glob("*.yaml"))
    assert TRAIN_PATH in paths and TUNE_PATH in paths
    for path in paths:
        values = yaml.safe_load(path.read_text())
        same = [k for k, v in values.items()
                if k != "subset" and k in defaults and v == defaults[k]]
        assert same == [], f"{path.name} repeats defaults {same}"
        same = [k for k in cfg.TUNING_KEYS if k in values and values[k] == tuning_defaults[k]]
        assert same == [], f"{path.name} repeats tuning defaults {same}"


def test_make_trains_config_is_short():
    comments = [line for line in TRAIN_PATH.read_text().splitlines()
                if line.lstrip().startswith("#")]
    assert len(comments) <= 12


def test_the_batch_256_recipe_changes_only_the_effective_batch():
    recipe = cfg.load(ROOT / "experiments" / "fd001_b256.yaml")
    assert (recipe.effective_batch_size, recipe.micro_batch_size, recipe.accumulation_steps) == (
        256, 256, 1)
    # B = micro x K is not stated twice in to_dict: K alone differs from the default
    assert {k: v for k, v in recipe.to_dict().items() if OLD_FD001.get(k) != v} == {
        "accumulation_steps": 1}


def test_the_150_epoch_recipe_is_the_batch_256_recipe_trained_longer():
    recipe = cfg.load(ROOT / "experiments" / "fd001_b256_e150.yaml")
    batch_256 = cfg.load(ROOT / "experiments" / "fd001_b256.yaml")
    assert {k: v for k, v in recipe.to_dict().items() if batch_256.to_dict()[k] != v} == {
        "epochs": 150}
    assert (recipe.effective_batch_size, recipe.scheduler, recipe.patience) == (
        256, "cosine", 20)



def test_the_batch_32_recipe_is_the_150_epoch_recipe_with_batch_32():
    recipe = cfg.load(ROOT / "experiments" / "fd001_b32_e150.yaml")
    longer = cfg.load(ROOT / "experiments" / "fd001_b256_e150.yaml")
    assert (recipe.effective_batch_size, recipe.micro_batch_size, recipe.accumulation_steps) == (
        32, 32, 1)
    assert {k: v for k, v in recipe.to_dict().items() if longer.to_dict()[k] != v} == {
        "micro_batch_size": 32}


def test_the_folds_recipe_is_the_batch_32_recipe_as_5_folds():
    recipe = cfg.load(ROOT / "experiments" / "fd001_b32_e150_folds5.yaml")
    single = cfg.load(ROOT / "experiments" / "fd001_b32_e150.yaml")
    assert {k: v for k, v in recipe.to_dict().items() if single.to_dict().get(k) != v} == {
        "ensemble": 5, "ensemble_split": "folds"}


def test_the_age_recipe_is_the_batch_32_recipe_with_the_engines_age():
    recipe = cfg.load(ROOT / "experiments" / "fd001_b32_e150_cycle.yaml")
    single = cfg.load(ROOT / "experiments" / "fd001_b32_e150.yaml")
    assert {k: v for k, v in recipe.to_dict().items() if single.to_dict().get(k) != v} == {
        "include_cycle": True}


def test_include_cycle_is_stated_only_when_on():
    on = cfg.load(overrides=["include_cycle=true"])
    assert on.to_dict() == {**cfg.load().to_dict(), "include_cycle": True}
    assert on.replace(seed=1).include_cycle is True
    assert "include_cycle" not in cfg.load().to_dict()  # old configs keep their digest


def test_make_tune_searches_around_make_trains_recipe_from_the_recipe_itself():
    tuning = cfg.load_tuning(TUNE_PATH)
    assert tuning.train.to_dict() == RECIPE
    assert tuning.baseline_trial  # trial 0: the recipe, which every dimension can draw
    for key, dimension in tuning.search_space.items():
        value = RECIPE.get(key, tuning.train.effective_batch_size)
        if isinstance(dimension, cfg.Categorical):
            assert value in dimension.choices, key
        else:
            assert dimension.low < value < dimension.high, key
    assert (tuning.n_trials, tuning.pruner, tuning.pruner_warmup_epochs) == (8, "median", 15)
    assert (tuning.max_effective_batch, tuning.scale_lr_with_batch) == (None, False)
    assert tuning.study_name is None and tuning.effective_study_name == "rul-fd001-tune"
    named = tuning.replace(study_name="mine", subset="fd003")
    assert (named.effective_study_name, named.train.subset) == ("mine", "FD003")
    assert tuning.replace(subset="fd002").effective_study_name == "rul-fd002-tune"


def test_tuning_keys_are_the_tuning_models_own_fields():
    assert cfg.TUNING_KEYS == ("search_space", "max_effective_batch", "scale_lr_with_batch",
                               "n_trials", "seeds_per_trial", "baseline_trial", "promote", "pruner",
                               "pruner_warmup_epochs", "study_name",
                               "heartbeat_interval", "heartbeat_grace_period",
                               "retry_dead_trials", "objectives")
    assert not set(cfg.TUNING_KEYS) & set(cfg.TrainConfig.model_fields)


def test_overrides_and_derived_properties():
    c = cfg.load(TRAIN_PATH, ["epochs=5", "lr=3e-4", "model=gru", "max_grad_norm=null"])
    assert (c.epochs, c.lr, c.model, c.max_grad_norm) == (5, 3e-4, "gru", None)
    d = cfg.load(TRAIN_PATH, {"micro_batch_size": 64, "accumulation_steps": 8})
    assert d.effective_batch_size == 512
    assert d.experiment_name == "rul-fd001"
    assert d.replace(experiment="x").experiment_name == "x"
    assert d.n_conditions == 1
    assert cfg.load(None, ["subset=fd002"]).n_conditions == 6  # subset names in any case
    assert cfg.load(None, ["subset=fd002"]).subset == "FD002"
    assert cfg.load(None, ["condition_scaling=global", "subset=FD004"]).n_conditions == 1
    assert cfg.load(None, ["condition_scaling=per_condition"]).n_conditions == 6
    assert cfg.load(None, {"data_dir": Path("/tmp/x")}).data_dir == "/tmp/x"


# ---------------------------------------------------------------- numbers written as YAML strings


def test_yaml_string_floats_are_numbers(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 3e-4\nweight_decay: 1e-5\nmax_grad_norm: 5E+0\n"
                    "search_space:\n  lr: {type: float, low: 1e-4, high: 1e-2, log: true}\n")
    raw = yaml.safe_load(path.read_text())
    assert raw["lr"] == "3e-4"  # what YAML 1.1 gives us
    path_train = tmp_path / "train.yaml"
    path_train.write_text("lr: 3e-4\nweight_decay: 1e-5\nmax_grad_norm: 5E+0\n")
    c = cfg.load(path_train)
    assert (c.lr, c.weight_decay, c.max_grad_norm) == (3e-4, 1e-5, 5.0)
    assert isinstance(c.lr, float)
    t = cfg.load_tuning(path)
    assert (t.train.lr, t.search_space["lr"].low, t.search_space["lr"].high) == (3e-4, 1e-4, 1e-2)


@pytest.mark.parametrize("text", ["3e-4x", "nan", ".inf", "1_0", "0x10", ""])
def test_only_clean_numeric_strings_count_as_numbers(text):
    assert train_error({"lr": text}).endswith(f"lr={text!r}: must be a number > 0")


# ---------------------------------------------------------------- bad values: one clear line each

TRAIN_ERRORS = [
    ("max_grad_norm=true", "max_grad_norm=True: must be a number > 0, or null to disable clipping"),
    ("max_grad_norm=0", "max_grad_norm=0: must be a number > 0, or null to disable clipping"),
    ("epochs=2.5", "epochs=2.5: must be a positive integer"),
    ("epochs=true", "epochs=True: must be a positive integer"),
    ("epochs='3'", "epochs='3': must be a positive integer"),
    ("micro_batch_size=0", "micro_batch_size=0: must be a positive integer"),
    ("micro_batch_size=abc", "micro_batch_size='abc': must be a positive integer"),
    ("lr=abc", "lr='abc': must be a number > 0"),
    ("lr=-1", "lr=-1: must be a number > 0"),
    ("lr=0", "lr=0: must be a number > 0"),
    ("weight_decay=-0.1", "weight_decay=-0.1: must be a number >= 0"),
    ("dropout=1.5", "dropout=1.5: must be a number in [0, 1)"),
    ("dropout=1", "dropout=1: must be a number in [0, 1)"),
    ("val_fraction=1", "val_fraction=1: must be a number between 0 and 1 (validation units"),
    ("ema_decay=1", "ema_decay=1: must be a number in [0, 1) (0 turns the weight average off)"),
    ("smoothing_alpha=0", "smoothing_alpha=0: must be a number in (0, 1]"),
    ("smoothing_alpha=1.5", "smoothing_alpha=1.5: must be a number in (0, 1]"),
    ("smoothing_alpha=abc", "smoothing_alpha='abc': must be a number in (0, 1]"),
    ("seed=-1", "seed=-1: must be a non-negative integer"),
    ("deterministic=maybe", "deterministic='maybe': must be true or false"),
    ("register=1", "register=1: must be true or false"),
    ("precision=fp8", "precision='fp8': must be one of auto, fp32, fp16, bf16"),
    ("model=mlp", "model='mlp': must be one of cnn, lstm, gru, transformer"),
    ("scheduler=step", "scheduler='step': must be one of none, cosine, onecycle"),
    ("device=tpu", "device='tpu': must be one of auto, cpu, cuda"),
    (["scheduler=onecycle", "warmup_epochs=2"], "warmup_epochs=2: scheduler='onecycle' warms "
                                                "up itself: give warmup_epochs=0 or another"),
    (["epochs=5", "warmup_epochs=6"], "warmup_epochs=6: must be at most epochs=5"),
    ("warmup_epochs=-1", "warmup_epochs=-1: must be a non-negative integer"),
    ("val_weights=last", "val_weights='last': must be one of windows, truncation"),
    ("train_sampling=all", "train_sampling='all': must be one of windows, truncation"),
    ("normalization=robust", "normalization='robust': must be one of minmax, zscore"),
    ("subset=FD009", "subset='FD009': must be one of FD001, FD002, FD003, FD004"),
    ("features=[s_99]", "features=['s_99']: unknown feature columns ['s_99']"),
    ("features=some", "features='some': features must be one of ['all', 'informative']"),
    ("features=5", "features=5: must be 'informative', 'all' or a list of sensor columns"),
    ("data_dir=5", "data_dir=5: must be a string or null"),
    (["model=transformer", "hidden_size=50"], "hidden_size=50: must be divisible by num_heads=4"),
    ("epoch=3", "unknown key(s) 'epoch' (did you mean 'epochs'?)"),
    ("lerning_rate=1", "unknown key(s) 'lerning_rate' (did you mean 'lr'?)"),
    ("batch_size=64", "unknown key(s) 'batch_size' (did you mean 'micro_batch_size'?)"),
    ("colour=red", "unknown key(s) 'colour'"),
]


@pytest.mark.parametrize("override,message", TRAIN_ERRORS)
def test_bad_training_values_are_one_clear_line(override, message):
    text = train_error(override)  # overrides as typed after the file: the command line's
    assert text.startswith(f"command line: {message}"), text
    assert "\n" not in text and "validation error" not in text and "pydantic" not in text


def test_an_error_names_where_its_value_came_from(tmp_path):
    with pytest.raises(cfg.ConfigError, match=r"^command line: epochs=0: must be a positive "
                                              r"integer$"):
        cfg.load(None, ["epochs=0"])
    written = tmp_path / "run.yaml"
    written.write_text("epochs: 0\nlr: 0.001\n")
    with pytest.raises(cfg.ConfigError) as error:
        cfg.load(written, ["lr=0", "epochs=3", "dropout=2"])
    assert str(error.value).splitlines() == [
        "command line: dropout=2: must be a number in [0, 1)",
        "command line: lr=0: must be a number > 0"]
    with pytest.raises(cfg.ConfigError, match=f"^{written}: epochs=0: must be a positive"):
        cfg.load(written, ["lr=0.01"])
    with pytest.raises(cfg.ConfigError, match="^overrides: lr=0: must be"):
        cfg.load(written, {"lr": 0, "epochs": 3})  # changes given by a program, not typed
    with pytest.raises(cfg.ConfigError, match="^config: ensemble_split='folds': needs "):
        cfg.build({"ensemble_split": "folds"})  # a file-less config: the defaults' name


def test_micro_batch_size_auto_keeps_the_batch_the_config_implies(tmp_path, capsys):
    config = cfg.load(TRAIN_PATH, ["micro_batch_size=auto"])  # the defaults' 256 x 2
    assert (config.micro_batch_size, config.effective_batch_size) == ("auto", 512)
    assert capsys.readouterr().err == (
        "micro_batch_size=auto keeps the effective batch of the config, 256 x 2 = 512 "
        "(state effective_batch_size to change it)\n")
    written = tmp_path / "run.yaml"
    written.write_text("micro_batch_size: 64\naccumulation_steps: 3\n")
    assert cfg.load(written, ["micro_batch_size=auto"]).effective_batch_size == 192
    assert cfg.load(written, ["micro_batch_size=auto",
                              "effective_batch_size=100"]).effective_batch_size == 100
    written.write_text("micro_batch_size: 64\neffective_batch_size: 100\n")
    assert cfg.load(written, ["micro_batch_size=auto"]).effective_batch_size == 100  # stated
    assert cfg.load(None, ["micro_batch_size=auto"]).effective_batch_size == 512
    capsys.readouterr()
    assert cfg.TrainConfig().replace(micro_batch_size="auto").effective_batch_size == 512
    assert capsys.readouterr().err == ""  # a program's change: derived, not announced
    written.write_text("micro_batch_size: auto\n")  # the file's own auto states no batch
    with pytest.raises(cfg.ConfigError, match=f"^{written}: micro_batch_size='auto': needs "
                                              "effective_batch_size"):
        cfg.load(written)
    tuning = cfg.load_tuning(TUNE_PATH, ["micro_batch_size=auto"])
    assert tuning.train.effective_batch_size == 512


def test_a_rule_names_the_sources_of_the_keys_it_is_about(tmp_path):
    written = tmp_path / "run.yaml"
    written.write_text("micro_batch_size: 100\n")
    with pytest.raises(cfg.ConfigError) as error:
        cfg.load(written, ["effective_batch_size=500"])
    assert str(error.value).startswith(
        f"{written} and command line: effective_batch_size=500: disagrees with "
        "micro_batch_size=100 x accumulation_steps=2")
    with pytest.raises(cfg.ConfigError, match="^command line: effective_batch_size=500: "):
        cfg.load(None, ["effective_batch_size=500", "accumulation_steps=3"])


def test_tuning_keys_given_to_train_point_to_rul_tune():
    assert train_error("n_trials=3") == (
        "command line: 'n_trials' is a tuning key used by `rul tune`, not by `rul train`")
    with pytest.raises(cfg.ConfigError) as error:
        cfg.load(TUNE_PATH)  # the tuning file read by `rul train`
    assert str(error.value) == (
        f"{TUNE_PATH}: 'n_trials', 'baseline_trial', 'pruner_warmup_epochs', 'search_space' are "
        "tuning keys used "
        "by `rul tune`, not by `rul train`")


def test_several_problems_are_reported_together_one_per_line():
    lines = train_error(["foo=1", "epochs=0", "lr=-1", "n_trials=2"]).splitlines()
    assert lines == [
        "command line: unknown key(s) 'foo'",
        "command line: 'n_trials' is a tuning key used by `rul tune`, not by `rul train`",
        "command line: epochs=0: must be a positive integer",
        "command line: lr=-1: must be a number > 0",
    ]


def test_a_key_given_twice_in_a_file_is_named_not_silently_the_last(tmp_path):
    """A YAML mapping with a key twice (the file's top level or a search space's): one line
    naming it and where it was first; on the command line the last value wins."""
    twice = tmp_path / "twice.yaml"
    twice.write_text("epochs: 1\nlr: 0.001\nepochs: 2\n")
    with pytest.raises(cfg.ConfigError) as error:
        cfg.load(twice)
    assert str(error.value) == f"{twice}:3:1: not valid YAML: key 'epochs' given twice " \
                               "(first on line 1)"
    twice.write_text("search_space:\n  lr: {type: float, low: 0.001, high: 0.01}\n"
                     "  lr: {type: float, low: 0.001, high: 0.02}\n")
    with pytest.raises(cfg.ConfigError, match=r"twice.yaml:3:3: not valid YAML: key 'lr' "
                                              r"given twice \(first on line 2\)$"):
        cfg.load_tuning(twice)
    # the command line: a key given again wins (scripts append to a line of overrides)
    assert cfg.load(None, ["epochs=1", "epochs=2"]).epochs == 2


def test_bad_override_and_bad_files_are_named(tmp_path):
    assert train_error("noequals") == "command line: override 'noequals' must look like key=value"
    bad = tmp_path / "bad.yaml"
    bad.write_text("epochs: 3\nlr: [1,\n")
    with pytest.raises(cfg.ConfigError) as error:
        cfg.load(bad)
    assert str(error.value) == (f"{bad}:3:1: not valid YAML: expected the node content, but "
                                "found '<stream end>' (while parsing a flow node)")
    bad.write_text("epochs: 3\nlr: 1e-3\n  dropout: 0.2\n")
    with pytest.raises(cfg.ConfigError) as error:
        cfg.load(bad)
    assert str(error.value) == f"{bad}:3:10: not valid YAML: mapping values are not allowed here"
    bad.write_text('run_name: "open\nepochs: 3\n')
    with pytest.raises(cfg.ConfigError) as error:
        cfg.load(bad)
    assert str(error.value) == (f"{bad}:3:1: not valid YAML: found unexpected end of stream "
                                "(while scanning a quoted scalar that starts at 1:11)")
    bad.write_bytes(b"epochs: 3\nrun_name: caf\xe9\n")
    with pytest.raises(cfg.ConfigError, match=r"bad.yaml: not a UTF-8 text file \(byte 23: "):
        cfg.load(bad)
    with pytest.raises(cfg.ConfigError, match="missing.yaml: config file not found"):
        cfg.load(tmp_path / "missing.yaml")
    listing = tmp_path / "list.yaml"
    listing.write_text("- epochs\n")
    with pytest.raises(cfg.ConfigError, match="list.yaml: expected a mapping"):
        cfg.load_tuning(listing)


# ---------------------------------------------------------------- tuning config

FLOAT_LR = {"type": "float", "low": 1e-4, "high": 1e-2}
TUNE_ERRORS = [
    ({"pruner_warmup_epochs": -3}, "pruner_warmup_epochs=-3: must be a non-negative integer"),
    ({"n_trials": 0}, "n_trials=0: must be a positive integer"),
    ({"pruner": "asha"}, "pruner='asha': must be one of median, hyperband, none"),
    ({"max_effective_batch": 0}, "max_effective_batch=0: must be a positive integer or null"),
    ({"scale_lr_with_batch": "yes"}, "scale_lr_with_batch='yes': must be true or false"),
    ({"max_effective_batch": 16}, "max_effective_batch=16: every trial would be pruned: the "
     "smallest effective_batch_size is 256"),
    ({"n_trial": 3}, "unknown key(s) 'n_trial' (did you mean 'n_trials'?)"),
    ({"lerning_rate": 1}, "unknown key(s) 'lerning_rate' (did you mean 'lr'?)"),
    ({"epochs": 0}, "epochs=0: must be a positive integer"),  # training keys checked too
    ({"search_space": 5}, "search_space=5: must be a mapping of training keys to distributions"),
    ({"search_space": {"lerning_rate": FLOAT_LR}},
     "search_space: 'lerning_rate' is not a tunable training key (did you mean 'lr'?)"),
    ({"search_space": {"data_dir": {"type": "categorical", "choices": ["a", "b"]}}},
     "search_space: 'data_dir' is not a tunable training key"),
    ({"search_space": {"tracking_uri": {"type": "categorical", "choices": ["a"]}}},
     "search_space: 'tracking_uri' is not a tunable training key"),
    ({"search_space": {"n_trials": {"type": "int", "low": 1, "high": 3}}},
     "search_space: 'n_trials' is not a tunable training key"),
    ({"search_space": {"lr": {"type": "normal", "low": 0, "high": 1}}},
     "search_space.lr: needs type categorical (choices) or int/float (low, high, optional log)"),
    ({"search_space": {"lr": {"low": 0, "high": 1}}},
     "search_space.lr: needs type categorical (choices) or int/float (low, high, optional log)"),
    ({"search_space": {"lr": 0.1}},
     "search_space.lr: needs type categorical (choices) or int/float (low, high, optional log)"),
    ({"search_space": {"model": {"type": "categorical", "choices": []}}},
     "search_space.model: choices=[]: must be a non-empty list of values"),
    ({"search_space": {"model": {"type": "categorical"}}},
     "search_space.model: choices is missing (categorical needs choices)"),
    ({"search_space": {"model": {"type": "categorical", "choices": ["cnn", "mlp"]}}},
     "search_space.model: choice 'mlp': must be one of cnn, lstm, gru, transformer"),
    ({"search_space": {"lr": {"type": "float", "low": 1e-2, "high": 1e-4}}},
     "search_space.lr: low=0.01: must be less than high=0.0001"),
    ({"search_space": {"num_layers": {"type": "int", "low": 3, "high": 3}}},
     "search_space.num_layers: low=3: must be less than high=3"),
    ({"search_space": {"lr": {"type": "float", "low": 0, "high": 1e-2, "log": True}}},
     "search_space.lr: low=0.0: must be > 0 with log: true"),
    ({"search_space": {"lr": {"type": "float", "high": 1e-2}}},
     "search_space.lr: low is missing (float needs low, high and optional log)"),
    ({"search_space": {"lr": {**FLOAT_LR, "logg": True}}},
     "search_space.lr: unknown key 'logg' (did you mean 'log'?)"),
    ({"search_space": {"lr": {**FLOAT_LR, "log": "yes"}}},
     "search_space.lr: log='yes': must be true or false"),
    ({"search_space": {"num_layers": {"type": "int", "low": 1.5, "high": 3}}},
     "search_space.num_layers: low=1.5: must be an integer"),
    ({"search_space": {"dropout": {"type": "float", "low": 0, "high": 1.5}}},
     "search_space.dropout: high=1.5: must be a number in [0, 1)"),
    ({"search_space": {"num_layers": {"type": "float", "low": 1, "high": 4}}},
     "search_space.num_layers: low=1.0: must be a positive integer (type float draws fractions"),
    ({"search_space": {"num_layers": {"type": "int", "low": 0, "high": 4}}},
     "search_space.num_layers: low=0: must be a positive integer"),
]


@pytest.mark.parametrize("changes,message", TUNE_ERRORS)
def test_bad_tuning_values_are_one_clear_line(changes, message):
    text = tune_error(changes)
    assert text.startswith(f"overrides: {message}"), text
    assert "\n" not in text and "validation error" not in text


def test_tuning_splits_the_flat_file_and_overrides():
    t = cfg.load_tuning(TUNE_PATH, ["lr=2e-3", "n_trials=4", "pruner=hyperband",
                                    "search_space={lr: {type: float, low: 1e-4, high: 1e-2}}"])
    assert isinstance(t.train, cfg.TrainConfig)
    assert (t.train.lr, t.train.epochs, t.n_trials, t.pruner) == (2e-3, 35, 4, "hyperband")
    assert list(t.search_space) == ["lr"]
    assert isinstance(t.search_space["lr"], cfg.FloatRange) and not t.search_space["lr"].log
    flat = t.to_dict()
    assert flat["lr"] == 2e-3 and flat["n_trials"] == 4 and "train" not in flat
    assert cfg.build_tuning(flat) == t  # the flat form round-trips


def test_cross_field_values_of_a_trial_are_left_to_the_trial():
    """hidden_size 50 is fine for the field; with a transformer it is the trial that is pruned."""
    t = cfg.load_tuning(TUNE_PATH, {"model": "transformer", "hidden_size": 64,
                                       "baseline_trial": False})
    assert t.search_space["hidden_size"].choices == [32, 50, 100]


# ---------------------------------------------------------------- immutability, replace


def test_replace_returns_a_revalidated_copy():
    base = cfg.load(TRAIN_PATH)
    changed = base.replace(lr="5e-4", epochs=3)
    assert (changed.lr, changed.epochs) == (5e-4, 3)
    assert (base.lr, base.epochs) == (0.0148, 35)  # the original is untouched
    with pytest.raises(cfg.ConfigError, match=r"^config: epochs=0: must be a positive integer$"):
        base.replace(epochs=0)
    with pytest.raises(cfg.ConfigError, match="hidden_size=50: must be divisible by num_heads=4"):
        base.replace(model="transformer", hidden_size=50)
    with pytest.raises(cfg.ConfigError, match="'n_trials' is a tuning key"):
        base.replace(n_trials=3)
    with pytest.raises(ValueError, match="frozen"):
        base.epochs = 0
    tuning = cfg.load_tuning(TUNE_PATH)
    with pytest.raises(cfg.ConfigError, match="pruner_warmup_epochs=-1: must be a non-negative"):
        tuning.replace(pruner_warmup_epochs=-1)
    with pytest.raises(cfg.ConfigError, match="dropout=2: must be a number in"):
        tuning.replace(dropout=2)


# ---------------------------------------------------------------- command line


@pytest.mark.parametrize("args,message", [
    (["train", str(TRAIN_PATH), "epochs=0"], "epochs=0: must be a positive integer"),
    (["train", "lerning_rate=0.1"],
     "command line: unknown key(s) 'lerning_rate' (did you mean 'lr'?)"),
    (["train", str(TRAIN_PATH), "lr=0"], "command line: lr=0: must be a number > 0"),
    (["train", str(TUNE_PATH)], "are tuning keys used by `rul tune`, not by `rul train`"),
    (["tune", str(TUNE_PATH), "pruner_warmup_epochs=-3"],
     "pruner_warmup_epochs=-3: must be a non-negative integer"),
    (["tune", str(TUNE_PATH), "search_space={lr: {type: float, low: 1, high: 0.1}}"],
     "search_space.lr: low=1.0: must be less than high=0.1"),
    (["tune", str(TRAIN_PATH)], "the config has no search_space to tune"),
    (["tune", str(TUNE_PATH), "--workers", "2", "--storage", "sqlite:///o.db"],
     "--storage sqlite:///o.db: SQLite storage is unsafe with --workers > 1"),
])
def test_cli_refuses_bad_configs_with_exit_code_2_and_no_traceback(args, message, tmp_path,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


@pytest.mark.parametrize("mistake", ["epoks=3", "model=foo", "bad-data", "tune n_trials=x"])
def test_a_mistake_is_answered_before_torch_and_mlflow_are_imported(mistake, write_cmapss,
                                                                    rewrite, tmp_path):
    """The config, the overrides and the data files are checked first (how long that takes
    is `python -m bench mistakes`): a mistake imports neither torch nor mlflow."""
    import subprocess
    import sys

    folder = write_cmapss()
    rewrite(folder / "train_FD001.txt", 3, lambda tokens: tokens + ["1.0"])
    args = {"epoks=3": ["train", "epoks=3"], "model=foo": ["train", "model=foo"],
            "bad-data": ["train", f"data_dir={folder}"],
            "tune n_trials=x": ["tune", "n_trials=x"]}[mistake]
    script = ("import sys\nfrom click.testing import CliRunner\nfrom rul.cli import main\n"
              f"r = CliRunner().invoke(main, {args!r})\n"
              "print(r.exit_code, 'torch' in sys.modules, 'mlflow' in sys.modules)\n"
              "print(r.output.strip().splitlines()[-1])")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=tmp_path)
    code, line = done.stdout.splitlines()
    assert code == "2 False False", (done.stdout, done.stderr[-500:])
    assert line.startswith("Error: ") and ("line 3" in line if mistake == "bad-data" else True)


def test_the_b512_study_searches_the_cards_own_recipe():
    """experiments/tune_fd001_b512.yaml keeps `make train`'s 256 x 2 and patience and draws
    only the rate, its warm-up, the epochs and the weight average; every draw is a valid
    config (the longest warm-up is shorter than the fewest epochs)."""
    study = cfg.load_tuning(ROOT / "experiments" / "tune_fd001_b512.yaml")
    card = cfg.load(ROOT / "experiments" / "fd001_b512_adamw.yaml")  # the recipe it chose
    keep = ("micro_batch_size", "accumulation_steps", "patience", "model", "window", "rul_cap")
    assert {k: getattr(study.train, k, None) for k in keep} == {
        k: getattr(card, k, None) for k in keep}
    space = study.search_space
    assert set(space) == {"lr", "warmup_epochs", "epochs", "ema_decay"}
    assert space["warmup_epochs"].high < min(space["epochs"].choices)
    before = cfg.load(ROOT / "experiments" / "fd001_b512_e100.yaml")
    assert space["lr"].low == before.lr  # the rate before the study is in the search
    assert space["lr"].low < card.lr < space["lr"].high  # and the one it chose
    assert card.warmup_epochs in range(space["warmup_epochs"].low, space["warmup_epochs"].high + 1)
    assert card.epochs in space["epochs"].choices and card.ema_decay in space["ema_decay"].choices


def test_the_muon_studies_search_make_trains_batch_and_hold_its_recipe():
    """experiments/tune_fd001_muon.yaml and tune_fd001_muon_regular.yaml keep `make train`'s
    256 x 2, optimizer, warm-up and weight average; the first drew the rate, weight decay,
    dropout and epochs (make train keeps its weight decay; its epochs, chosen later with the
    truncation draw, lie between the first study's two), the second the rate, dropout, head
    width and smoothing at the 50 epochs make train had then: make train's values lie in it."""
    first = cfg.load_tuning(ROOT / "experiments" / "tune_fd001_muon.yaml")
    second = cfg.load_tuning(ROOT / "experiments" / "tune_fd001_muon_regular.yaml")
    card = cfg.load(TRAIN_PATH)
    keep = ("micro_batch_size", "accumulation_steps", "patience", "optimizer", "warmup_epochs",
            "ema_decay", "model", "window", "rul_cap")
    for study in (first, second):
        assert {k: getattr(study.train, k) for k in keep} == {k: getattr(card, k) for k in keep}
    space = first.search_space
    assert set(space) == {"lr", "weight_decay", "dropout", "epochs"}
    assert card.weight_decay in space["weight_decay"].choices
    assert min(space["epochs"].choices) < card.epochs < max(space["epochs"].choices)
    space = second.search_space
    assert set(space) == {"lr", "dropout", "smoothing_alpha", "hidden_size"}
    assert (second.train.epochs, second.train.weight_decay) == (50, card.weight_decay)
    assert space["lr"].low < card.lr < space["lr"].high
    assert space["dropout"].low < card.dropout < space["dropout"].high
    assert card.smoothing_alpha in space["smoothing_alpha"].choices
    assert card.hidden_size in space["hidden_size"].choices
