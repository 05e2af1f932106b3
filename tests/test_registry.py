"""The experiment's UI kind, the registry's descriptions and tags, and the champion guard.

Runs here are made by hand (params, metrics, tags as a tracked training writes them) around one
tiny logged pyfunc model, so registering costs milliseconds, not a training. The race test
registers from two real processes into one SQLite store.
"""

import math
import multiprocessing
import queue

import mlflow
import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from rul.data.schema import COLUMNS
from rul.serving.predictor import REQUEST_PARAMS, check_params
from rul.tracking import registry
from rul.tracking.registry import (
    CHAMPION,
    best_version,
    register_and_promote,
    registered_model_name,
)
from rul.tracking.store import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, configure, ensure_experiment

PARAMS = {"model": "cnn", "window": "30", "effective_batch_size": "512",
          "micro_batch_size": "256", "accumulation_steps": "2", "lr": "0.001", "epochs": "80",
          "precision": "auto"}
DIGESTS = {"data.sha256.train": "a" * 64, "data.sha256.test": "b" * 64,
           "data.sha256.rul": "c" * 64}


class Echo(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input: list[str], params=None) -> list[str]:
        return model_input


@pytest.fixture(scope="module")
def store(tmp_path_factory, mlflow_store_at):
    """One store for the module (a new SQLite store costs seconds); each test registers its
    own model name, see `name`."""
    with mlflow_store_at(tmp_path_factory.mktemp("registry")) as fresh:
        configure(fresh.uri)
        fresh.experiment_id = ensure_experiment("rul-registry-tests")
        with mlflow.start_run(experiment_id=fresh.experiment_id) as run:
            logged = mlflow.pyfunc.log_model(name="model", python_model=Echo())
        fresh.model_uri = logged.model_uri
        fresh.model_run_id = run.info.run_id
        fresh.client = MlflowClient(tracking_uri=fresh.uri)
        yield fresh


@pytest.fixture
def name(store) -> str:
    """A registered model name of this test's own, in the shared store."""
    store.names = getattr(store, "names", 0) + 1
    configure(store.uri)  # another test may have moved MLflow's global URI
    return f"rul-fd{store.names:03d}"


def make_run(store, run_name="cnn-b512-k2-s42", test_rmse=12.5) -> str:
    """A finished run carrying what a tracked training records about itself."""
    client = store.client
    run = client.create_run(store.experiment_id, run_name=run_name,
                            tags={**DIGESTS, "subset": "FD001"})
    run_id = run.info.run_id
    for key, value in PARAMS.items():
        client.log_param(run_id, key, value)
    for key, value in {"test_rmse": test_rmse, "test_mae": 9.25, "test_score": 321.5}.items():
        client.log_metric(run_id, key, value)
    client.set_terminated(run_id)
    return run_id


def register(store, name, val_rmse, run_id=None) -> dict:
    return register_and_promote(store.model_uri, name, run_id or make_run(store), val_rmse)


def champion(store, name) -> str:
    return str(store.client.get_model_version_by_alias(name, CHAMPION).version)


# ---------------------------------------------------------------- experiment kind


def test_experiments_open_as_model_development_in_the_ui(store):
    configure(store.uri)
    client = store.client
    new = ensure_experiment("rul-fd001")
    assert client.get_experiment(new).tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    assert ensure_experiment("rul-fd001") == new

    old = client.create_experiment("made-before")  # an existing experiment without the tag
    assert EXPERIMENT_KIND_TAG not in client.get_experiment(old).tags
    assert ensure_experiment("made-before") == old
    assert client.get_experiment(old).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND

    guessed = client.create_experiment(
        "guessed", tags={EXPERIMENT_KIND_TAG: "genai_development_inferred"})
    ensure_experiment("guessed")
    assert client.get_experiment(guessed).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    chosen = client.create_experiment("chosen", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    ensure_experiment("chosen")  # a kind someone set on purpose stays
    assert client.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "genai_development"


# ---------------------------------------------------------------- descriptions and tags


def test_registered_model_name():
    assert registered_model_name("FD001") == "rul-fd001"
    assert registered_model_name("fd004") == "rul-fd004"


def test_registered_model_and_version_are_described_and_tagged(store, name):
    run_id = make_run(store, test_rmse=12.345)
    record = register(store, name, 11.987654, run_id)
    version = store.client.get_model_version(name, record["registered_version"])

    model = store.client.get_registered_model(name)
    assert "Remaining useful life" in model.description
    assert ", ".join(COLUMNS) in model.description  # the input columns, in order
    assert f'mlflow.pyfunc.load_model("models:/{name}@champion")' in model.description
    for param in REQUEST_PARAMS:  # every parameter the model takes, from the code's table
        assert f"- `{param.name}` ({param.type}, default " in model.description, param.name
        assert param.meaning in model.description
    assert [param.name for param in REQUEST_PARAMS] == list(check_params({}))

    lines = version.description.splitlines()
    assert lines[0] == "Validation RMSE 11.988 cycles."  # a run without selection evidence
    assert lines[1] == ("Test (held out, reported, never selected on): RMSE 12.345, MAE 9.250, "
                        "PHM08 score 321.5.")
    assert lines[2] == (f"Data: FD001 (n/a track), SHA-256 rul {'c' * 64}; test {'b' * 64}; "
                        f"train {'a' * 64}.")
    assert lines[3].startswith(f"Columns read, in order (26): {', '.join(COLUMNS)}.")
    assert lines[4] == "Engines: not recorded."
    assert lines[5].startswith("Recipe: cnn, ") and ("lr 0.001, window 30, effective batch 512 "
                                                     "(256 x 2), 80 epochs, auto; seed") in lines[5]
    assert lines[-1] == f"Run {run_id} (cnn-b512-k2-s42)."

    assert version.run_id == store.model_run_id  # the model's own run ...
    tags = version.tags
    assert tags["run_id"] == run_id  # ... and the run that trained and evaluated it
    assert float(tags["val_rmse"]) == 11.987654
    assert float(tags["test_rmse"]) == 12.345
    assert tags["subset"] == "FD001"
    for key, digest in DIGESTS.items():
        assert tags[key] == digest
    assert tags["champion_promoted"] == "true"


# ---------------------------------------------------------------- the champion rule


def test_champion_moves_only_to_a_strictly_better_version(store, name):
    first = register(store, name, 10.0)
    assert first["champion_promoted"] == "true" and first["champion_previous_version"] == "none"
    v1 = str(first["registered_version"])
    assert champion(store, name) == v1

    worse_run = make_run(store)
    worse = register(store, name, 11.0, worse_run)
    assert worse["champion_promoted"] == "false"
    assert champion(store, name) == v1
    tags = store.client.get_run(worse_run).data.tags
    assert tags["champion_previous_version"] == v1
    assert float(tags["champion_previous_val_rmse"]) == 10.0
    assert tags["champion_version"] == v1

    tie = register(store, name, 10.0)  # equal validation RMSE keeps the older champion
    assert tie["champion_promoted"] == "false" and champion(store, name) == v1

    better = register(store, name, 9.5)
    assert better["champion_promoted"] == "true"
    assert champion(store, name) == str(better["registered_version"])
    assert better["champion_previous_version"] == v1


def test_best_version_rule():
    assert best_version({}, None) is None
    assert best_version({"1": math.inf}, None) is None  # no val_rmse tag: never champion
    assert best_version({"1": 3.0, "2": 2.0, "3": 2.5}, "1") == "2"
    assert best_version({"1": 2.0, "2": 2.0}, None) == "1"  # tie: the oldest
    assert best_version({"1": 2.0, "2": 2.0, "3": 2.0}, "2") == "2"  # tie: the champion stays
    assert best_version({"9": 2.0, "10": 2.0}, None) == "9"  # versions compare as numbers


def test_a_move_decided_on_a_stale_read_is_corrected(store, name, monkeypatch):
    """Run A decides to promote its version; before its alias write lands, run B registers a
    better version and finishes. A's write is stale: A must see B's version and move again."""
    v1 = str(register(store, name, 10.0)["registered_version"])
    raced = {}

    class RacingClient(MlflowClient):
        def set_registered_model_alias(self, model, alias, version):
            if not raced:  # B, start to finish, between A's read and A's write
                raced["started"] = True
                raced["b"] = register(store, model, 1.0)
            super().set_registered_model_alias(model, alias, version)

    monkeypatch.setattr(registry, "MlflowClient", RacingClient)
    a = register(store, name, 5.0)
    b = raced["b"]
    assert champion(store, name) == str(b["registered_version"])
    assert a["champion_promoted"] == "false" and b["champion_promoted"] == "true"
    assert a["champion_previous_version"] == v1
    assert int(a["champion_guard_rounds"]) == 2


def test_an_alias_inserted_by_another_process_at_the_same_moment_is_no_error(store, name,
                                                                           monkeypatch):
    """Two first registrations: both find no champion, both insert the alias, and MLflow's
    SQL store fails one insert on the alias's unique key. The loser reads the winner's alias
    and decides again: the alias ends on the better of the two, no error."""
    raced = {}

    class RacingClient(MlflowClient):
        def set_registered_model_alias(self, model, alias, version):
            if not raced:  # the other process's insert lands first
                raced["started"] = True
                raced["other"] = register(store, model, 1.0)
                raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: "
                                      "registered_model_aliases.name, registered_model_aliases"
                                      ".alias")
            super().set_registered_model_alias(model, alias, version)

    monkeypatch.setattr(registry, "MlflowClient", RacingClient)
    mine = register(store, name, 5.0)
    assert champion(store, name) == str(raced["other"]["registered_version"])
    assert mine["champion_promoted"] == "false" and int(mine["champion_guard_rounds"]) == 2


# ---------------------------------------------------------------- two processes racing

# Per round: (worker 0's val_rmse, worker 1's val_rmse). The better one alternates between the
# workers; some rounds beat the champion with neither, one ties it exactly.
ROUNDS = [(20.0, 10.0), (9.0, 15.0), (30.0, 40.0), (8.5, 8.0), (7.9, 7.95), (7.9, 7.9),
          (5.0, 6.0), (6.0, 4.0)]
BARRIER_TIMEOUT = 120


def _race_worker(uri, model_uri, name, run_ids, values, barrier, results):
    configure(uri)
    for run_id, val_rmse in zip(run_ids, values, strict=True):
        barrier.wait(BARRIER_TIMEOUT)  # both workers start registering together
        try:
            record = register_and_promote(model_uri, name, run_id, val_rmse)
            results.put((run_id, str(record["registered_version"]), record["champion_promoted"]))
        except Exception as error:  # reported to the parent, which fails the test
            results.put((run_id, None, f"{type(error).__name__}: {error}"))
        barrier.wait(BARRIER_TIMEOUT)  # the parent checks the alias between rounds


@pytest.mark.slow
def test_two_processes_registering_at_once_leave_the_alias_on_the_best(store, name):
    """Real processes, racing at a barrier every round (spawn: ~10 s to start, hence slow).
    Timing decides whether a stale write happens in a given round; the interleaving test above
    forces one."""
    run_ids = [[make_run(store) for _ in ROUNDS] for _ in range(2)]
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(3), context.Queue()
    workers = [context.Process(target=_race_worker, args=(
        store.uri, store.model_uri, name, run_ids[w], [r[w] for r in ROUNDS], barrier, results))
        for w in range(2)]
    for worker in workers:
        worker.start()
    try:
        val_of_version, champion_before = {}, None
        for number, values in enumerate(ROUNDS):
            barrier.wait(BARRIER_TIMEOUT)
            barrier.wait(BARRIER_TIMEOUT)
            records = {}
            for _ in range(2):
                run_id, version, promoted = results.get(timeout=10)
                assert version is not None, promoted
                records[run_id] = (version, promoted)
            for w in range(2):
                val_of_version[records[run_ids[w][number]][0]] = values[w]
            best = min(val_of_version.values())
            alias = champion(store, name)
            assert val_of_version[alias] == best, f"round {number}: {val_of_version}, {alias}"
            if champion_before is not None and val_of_version[champion_before] == best:
                assert alias == champion_before, f"round {number}: a tie moved the champion"
            for version, promoted in records.values():
                # the round's champion was promoted; the other version may have been too, when
                # it registered first and beat the champion before the round (timing decides)
                could_lead = champion_before is None or (
                    val_of_version[version] < val_of_version[champion_before])
                assert promoted == "true" if version == alias else (
                    promoted == "false" or could_lead), f"round {number}: {version} {promoted}"
            champion_before = alias
        tags = {v.version: v.tags["val_rmse"] for v in
                store.client.search_model_versions(f"name='{name}'")}
        assert len(tags) == 2 * len(ROUNDS)
        assert {str(v): float(t) for v, t in tags.items()} == val_of_version
    finally:
        for worker in workers:
            worker.join(timeout=60)
            if worker.is_alive():
                worker.kill()
                worker.join()
    assert [w.exitcode for w in workers] == [0, 0]
    with pytest.raises(queue.Empty):
        results.get_nowait()


def test_a_run_is_registered_once(store, name):
    run_id = make_run(store)
    first = register(store, name, 12.0, run_id)
    again = register(store, name, 12.0, run_id)  # e.g. a resumed run that had registered
    assert again["registered_version"] == first["registered_version"]
    assert len(store.client.search_model_versions(f"name='{name}'")) == 1


def test_the_version_of_a_run_that_did_not_finish_never_takes_the_champion(store, name):
    """A run killed right after registering (left RUNNING, or marked KILLED since) keeps its
    version, but the alias moves only to versions of runs that finished."""
    register(store, name, 12.0)  # version 1, champion
    killed = make_run(store)
    register(store, name, 5.0, killed)  # version 2 would win...
    store.client.update_run(killed, status="KILLED")  # ...but its run never finished
    record = register(store, name, 11.0)  # version 3
    assert record["champion_version"] == "3"
    record = register(store, name, 5.0, killed)  # the killed run resumed and finished
    assert int(record["registered_version"]) == 2 and record["champion_version"] == "2"
