"""The run plan: every decision of a run made once, in one place, before anything is
tracked; one definition of a run's identity; seeds and members as plans that run side by
side with the numbers they have one after another."""

import inspect
import pickle
import re
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from rul import config as cfg
from rul import plan as plan_module
from rul.plan import EnsemblePlan, plan_ensemble, plan_run, plan_seeds
from rul.training.seeding import derive_seeds

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"filters": 4, "hidden_size": 8, "num_layers": 1, "window": 20, "epochs": 2,
         "patience": 5, "precision": "fp32", "device": "cpu", "smoothing_alpha": 1.0}


@pytest.fixture
def small(write_cmapss, mlflow_store):
    """A tiny config on synthetic C-MAPSS files, tracked in a fresh store."""
    folder = write_cmapss(train_lengths=(60,) * 12, test_lengths=(31, 45, 22, 38))

    def config(**changes):
        return cfg.load(None, {**SMALL, "data_dir": str(folder), "tracking_uri": mlflow_store.uri,
                               "checkpoint_dir": str(mlflow_store.root / "ckpt"), **changes})

    return config


# ---------------------------------------------------------------- each decision in one place


def counting(monkeypatch, name):
    calls = []
    real = getattr(plan_module, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(plan_module, name, counted)
    return calls


def test_a_tracked_run_resolves_device_precision_and_split_once(small, monkeypatch):
    from rul.workflows.train import train_tracked

    devices, precisions = counting(monkeypatch, "resolve_device"), counting(
        monkeypatch, "resolve_precision")
    probes = counting(monkeypatch, "probe_split")
    outcome, _ = train_tracked(small(micro_batch_size="auto", effective_batch_size=64,
                                     memory_budget="64GiB"), progress=False)
    assert (len(devices), len(precisions), len(probes)) == (1, 1, 1)
    assert outcome.plan.config.micro_batch_size == 64 and outcome.plan.split.micro_batch_size == 64
    assert outcome.plan.written.micro_batch_size == "auto"  # the identity keeps what was asked


def test_an_ensemble_decides_once_per_member(small, monkeypatch):
    precisions = counting(monkeypatch, "resolve_precision")
    ensemble = plan_ensemble(small(ensemble=3))
    assert len(precisions) == 3
    assert [p.config.seed for p in ensemble.members] == [42, 43, 44]
    assert all(p.data is ensemble.members[0].data for p in ensemble.members)  # one split
    assert {p.config.register for p in ensemble.members} == {False}


SOLE_DECIDERS = {"resolve_precision(": {"rul/plan.py", "rul/training/precision.py"},
                 "probe_split(": {"rul/plan.py", "rul/training/micro_batch.py"},
                 "keep_freed_memory(": {"rul/plan.py", "rul/training/hardware.py"},
                 "derive_seeds(": {"rul/plan.py", "rul/training/seeding.py"}}


@pytest.mark.parametrize("call, allowed", SOLE_DECIDERS.items())
def test_the_run_path_makes_each_decision_in_the_plan_only(call, allowed):
    """Outside the plan (and the decision's own module) nothing in rul/ calls the decision:
    the probe, the precision, malloc's settings and the seeds are the plan's."""
    callers = {str(p.relative_to(ROOT)) for p in (ROOT / "rul").rglob("*.py")
               if re.search(rf"(?<![\w.]){re.escape(call)}", p.read_text())}
    assert callers <= allowed, callers - allowed


def test_no_function_on_the_run_path_takes_more_than_six_parameters():
    from rul import cli, parallel
    from rul.tracking import run_logging, store
    from rul.training import micro_batch, run
    from rul.workflows import ensemble, evaluate, parent, tracked, train
    from rul.workflows import tune as study

    path = [cli.train.callback, cli.evaluate.callback, cli.tune.callback, study.run_study,
            study._worker, study.objective_for, micro_batch.probe_split, micro_batch.probe,
            train.train_tracked, train.resume_target, store.open_store,
            tracked.track, tracked.open_run, tracked._train_in_run,
            run_logging.log_plan, run_logging.log_outcome, plan_module.plan_run,
            plan_module.plan_ensemble, plan_module.plan_seeds, run.train,
            ensemble.train_ensemble, ensemble.track_ensemble, ensemble._track_member,
            evaluate.evaluate_seeds, evaluate._track_seed, parent.train_under_parent,
            parallel.run_tasks]
    too_many = {f.__qualname__: n for f in path
                if (n := len(inspect.signature(f).parameters)) > 6}
    assert not too_many


# ---------------------------------------------------------------- the run's identity


def test_the_key_lists_are_derived_from_the_roles():
    assert set(cfg.KEY_ROLES) <= set(cfg.TrainConfig.model_fields)
    assert set(cfg.NOT_IN_IDENTITY) == {"data_dir", "tracking_uri", "experiment", "register",
                                        "run_name", "checkpoint_dir", "device",
                                        "interval_coverage", "strict_data", "max_data_mb"}
    assert set(cfg.NOT_TUNABLE) == set(cfg.NOT_IN_IDENTITY) | {"subset", "data", "split_seed",
                                                               "ensemble", "ensemble_split",
                                                               "ensemble_training"}
    assert set(cfg.NOT_COMPARED_IN_A_STUDY) == set(cfg.NOT_IN_IDENTITY) | {
        "precision", "deterministic", "memory_budget"}


BEFORE_THE_RECIPE = ROOT / "experiments" / "fd001_b512_e100.yaml"  # + patience 20: the
# defaults of then


@pytest.mark.parametrize("path, overrides, digest", [
    (BEFORE_THE_RECIPE, {"patience": 20}, "22530c6237769408"),
    # make train's config while it read the engine's age (then fd001_age.yaml's recipe):
    # the recipe before the study with the age resumes its runs
    (BEFORE_THE_RECIPE, {"include_cycle": True}, "e49e820a1e3231c7"),
    (BEFORE_THE_RECIPE, {"patience": 20, "micro_batch_size": "auto", "effective_batch_size": 512,
                         "ensemble": 3, "include_cycle": True}, "7cc7efcd9382b33e"),
    # make train's and its age track's, from before the defaults became the recipe
    (None, {}, "3b4347845d9a1ac8"),
    (ROOT / "experiments" / "fd001.yaml", {}, "3b4347845d9a1ac8"),
    (ROOT / "experiments" / "fd001_age.yaml", {}, "7e3162a29106b870"),
])
def test_identities_of_runs_tracked_before_are_kept(path, overrides, digest):
    """`--resume` finds runs by their digest: the digests of runs tracked by earlier versions
    do not change."""
    from rul.tracking.run_names import config_digest

    assert config_digest(cfg.load(path, overrides)) == digest


def test_old_models_name_their_pyfunc_class_where_it_was():
    from rul.serving.pyfunc_model import RULModel

    assert pickle.loads(b"crul.tracking.pyfunc_model\nRULModel\n.") is RULModel


# ---------------------------------------------------------------- plans side by side


def test_seeds_in_parallel_give_the_numbers_of_seeds_one_after_another(small, mlflow_store):
    """`rul evaluate --jobs 2`: each seed in a worker process with 1 thread, the same numbers as
    the seeds one after another with 1 thread each; the children are FINISHED runs."""
    from rul.workflows.evaluate import evaluate_seeds

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sequential = evaluate_seeds(small(experiment="sequential"), 2, jobs=1, progress=False)
        parallel = evaluate_seeds(small(experiment="parallel"), 2, jobs=2, progress=False)
    finally:
        torch.set_num_threads(threads)
    strip = [{k: v for k, v in row.items() if k not in ("run_id", "seconds")}
             for row in sequential.rows]
    assert [{k: v for k, v in row.items() if k not in ("run_id", "seconds")}
            for row in parallel.rows] == strip
    assert parallel.aggregates == sequential.aggregates
    client = MlflowClient(mlflow_store.uri)
    experiment = client.get_experiment_by_name("parallel").experiment_id
    statuses = sorted(r.info.status for r in client.search_runs([experiment]))
    assert statuses == ["FINISHED"] * 3
    threads_used = {r.data.tags.get("torch_threads") for r in client.search_runs(
        [experiment], "tags.`rul.seed_index` != ''")}
    assert threads_used == {"1"}


def test_an_error_in_one_parallel_seed_fails_the_parent(small, mlflow_store, monkeypatch):
    from rul.workflows.evaluate import evaluate_seeds

    config = small(experiment="broken", window=200)  # every unit is shorter: no windows
    with pytest.raises(cfg.ConfigError, match="window=200: longer than every training unit"):
        evaluate_seeds(config, 2, jobs=2, progress=False)
    experiment = MlflowClient(mlflow_store.uri).get_experiment_by_name("broken")
    assert experiment is None  # planned before any run: nothing created


def test_plan_seeds_spaces_ensemble_seeds(small):
    plans = plan_seeds(small(ensemble=2), 2)
    assert all(isinstance(p, EnsemblePlan) for p in plans)
    assert [[m.config.seed for m in p.members] for p in plans] == [[42, 43], [44, 45]]
    single = plan_seeds(small(), 2)
    assert [p.config.seed for p in single] == [42, 43]
    assert single[0].data.val_units.tolist() != single[1].data.val_units.tolist()


def test_resume_target_reads_the_checkpoint_before_any_run_is_reopened(small, tmp_path):
    from rul.plan import ResumeTarget

    with pytest.raises(FileNotFoundError):
        plan_run(small(), ResumeTarget(tmp_path / "missing.pt", "run-id"))


def test_a_configs_runs_validate_on_the_same_engines_whatever_their_seed(fd001):
    """split_seed, not seed, picks the validation engines: seeds 42 and 43 of one config are
    scored on the same engines (and seed 42's are those every run of seed 42 had); rul
    evaluate's seeds still split apart, as an evaluation measures the spread over splits."""
    config = cfg.load(ROOT / "experiments" / "fd001.yaml", {"epochs": 1})
    first, second = (plan_run(c, subset=fd001) for c in (config, config.replace(seed=43)))
    assert (first.data.val_units == second.data.val_units).all()
    assert first.seeds.torch != second.seeds.torch  # its own init, dropout and batches
    assert derive_seeds(42, 42) == derive_seeds(42)  # make train's split as before
    assert "split_seed" not in config.replace(seed=43, split_seed=43).to_dict()
    assert config.replace(seed=43).to_dict()["split_seed"] == 42  # identity: another split
    evaluated = [tuple(plan.data.val_units) for plan in plan_seeds(config, 2)]
    assert evaluated[0] == tuple(first.data.val_units) != evaluated[1]
