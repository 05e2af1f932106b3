"""Model registry: every tracked model becomes a described version of `rul-<subset>`, and the
`champion` alias follows the version with the best selection score among versions of equal
evidence (rul.tracking.selection: the same engines, score and data), also under concurrent
runs; a version on other evidence moves it only when the champion, scored on that version's
engines, does worse. `rul promote` moves it by hand, who and why kept on the version. What a
version says of itself: rul.tracking.version_description.
"""

import math
from collections.abc import Callable

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from rul.console import said_in_one_line
from rul.data.schema import COLUMNS
from rul.serving.columns import meaning
from rul.serving.predictor import REQUEST_PARAMS
from rul.tracking.selection import key_of, recorded_engines
from rul.tracking.version_description import VAL_RMSE_TAG, version_description, version_tags

COLUMNS_TAG = "data.columns"  # a run's input columns, when its data set is one's own

CHAMPION = "champion"
MAX_GUARD_ROUNDS = 50  # each round is a few SQL reads; concurrent writers settle in a couple


def registered_model_name(dataset: str) -> str:
    """The registered model of a data set (a C-MAPSS subset or one's own): FD001 ->
    rul-fd001."""
    return f"rul-{dataset.lower()}"


def output_lines(outputs) -> list[str]:
    """One line per column of an output schema (mlflow.types.Schema): name, type, and its
    meaning from the table of served columns (rul.serving.columns)."""
    lines = []
    for column in outputs.inputs:
        said = meaning(column.name)
        kind = getattr(column.type, "name", column.type)  # DataType.string -> string
        lines.append(f"- `{column.name}` ({kind}){': ' + said if said else ''}")
    return lines


def param_lines() -> list[str]:
    """One line per request parameter the model takes (rul.serving.predictor.REQUEST_PARAMS):
    name, type, default and what it does."""
    return [f"- `{param.name}` ({param.type}, default `{str(param.default).lower()}`): "
            f"{param.meaning}" for param in REQUEST_PARAMS]


def model_description(name: str, outputs=None, inputs: list[str] | None = None,
                      dataset: str = "NASA C-MAPSS") -> str:
    """The registered model's description; `outputs`: the newest version's output schema, every
    column described; `inputs`: the columns it reads, as the data set names them (None: C-MAPSS)."""
    columns = "\n".join(output_lines(outputs)) if outputs is not None else (
        "- `unit`, `rul` at the unit's last cycle")
    inputs = inputs or COLUMNS
    return (
        f"Remaining useful life (cycles) of turbofan engines, {dataset}, model `{name}`.\n\n"
        f"Input: raw rows, one per engine cycle, columns {', '.join(inputs)}; give "
        "each unit's whole history (sensors are smoothed causally from its first cycle).\n\n"
        f"Output: one row per unit:\n{columns}\n\n"
        f"Parameters (`predict(rows, params={{...}})`, `rul predict`'s options):\n"
        f"{chr(10).join(param_lines())}\n\n"
        f"Load: `mlflow.pyfunc.load_model(\"models:/{name}@{CHAMPION}\").predict(rows)`, or "
        f"`rul predict --model models:/{name}@{CHAMPION} --input "
        f"{'data/cmapss/test_FD001.txt' if inputs == COLUMNS else 'rows.csv'}`.\n\n"
        f"The `{CHAMPION}` alias points at the version with the lowest selection RMSE (tag "
        "`selection.rmse`) among versions scored on the same engines, by the same score, on the "
        "same data (tags `selection.engines`, `selection.score`, `selection.data`)."
    )


def _describe_model(client: MlflowClient, name: str, model_uri: str, run) -> None:
    signature = mlflow.models.get_model_info(model_uri).signature
    columns = run.data.tags.get(COLUMNS_TAG)  # a data set of one's own: its columns
    description = model_description(
        name, signature.outputs if signature else None,
        columns.split(",") if columns else None,
        f"data set {run.data.tags.get('subset')}" if columns else "NASA C-MAPSS")
    if client.get_registered_model(name).description != description:
        client.update_registered_model(name, description=description)


def _versions(client: MlflowClient, name: str) -> list:
    """Every version of `name` (all pages)."""
    found, token = [], None
    while True:
        page = client.search_model_versions(f"name='{name}'", page_token=token)
        found += list(page)
        token = page.token
        if not token:
            return found


def _run_of(version) -> str | None:
    """The run a version was registered for (the tag register_and_promote sets; MLflow's
    own source run for versions registered otherwise)."""
    return version.tags.get("run_id") or version.run_id


def _val_rmse_by_version(client: MlflowClient, name: str, own_run: str | None = None,
                         key: dict | None = None) -> dict[str, float]:
    """Every version of `name` (with `key`: of that evidence only) and its validation RMSE:
    inf where it has none or its run did not finish (`own_run`, registering now, counts as
    finished)."""
    found, finished = {}, {}
    for v in _versions(client, name):
        if key is not None and key_of(v.tags) != key:
            continue
        run = _run_of(v)
        if run and run != own_run and run not in finished:
            finished[run] = client.get_run(run).info.status == "FINISHED"
        try:
            value = float(v.tags.get(VAL_RMSE_TAG, math.inf))
        except ValueError:
            value = math.inf
        found[str(v.version)] = value if finished.get(run, True) else math.inf
    return found


def _champion(client: MlflowClient, name: str) -> str | None:
    version = client.get_registered_model(name).aliases.get(CHAMPION)
    return None if version is None else str(version)


def best_version(val_rmse: dict[str, float], champion: str | None) -> str | None:
    """The version with the lowest validation RMSE; on a tie the current champion stays, else
    the oldest version wins. None when no version has a finite validation RMSE."""
    finite = {v: r for v, r in val_rmse.items() if math.isfinite(r)}
    if not finite:
        return None
    return min(finite, key=lambda v: (finite[v], v != champion, int(v)))


def _set_champion(client: MlflowClient, name: str, version: str) -> None:
    """Point the alias at `version`. Where the model has none yet, MLflow's SQL store inserts
    it, and of two processes inserting at once one fails the alias's unique key: no error, the
    other's alias is there, and move_champion reads it and decides again."""
    try:
        client.set_registered_model_alias(name, CHAMPION, version)
    except MlflowException as error:
        if "unique" not in str(error).lower():  # SQLite's and PostgreSQL's words for it
            raise


def move_champion(client: MlflowClient, name: str, own_run: str | None = None,
                  key: dict | None = None) -> tuple[str | None, int]:
    """Point `champion` at the best version of a finished run (or `own_run`'s) of evidence
    `key` (None: of any), convergently under concurrent registrations: set it, re-read, and
    repeat until neither the versions nor the alias changed meanwhile. Returns (champion
    version, rounds)."""
    for rounds in range(1, MAX_GUARD_ROUNDS + 1):
        versions = _val_rmse_by_version(client, name, own_run, key)
        champion = _champion(client, name)
        best = best_version(versions, champion if champion in versions else None)
        if best is not None and best != champion:
            _set_champion(client, name, best)
        if (_val_rmse_by_version(client, name, own_run, key) == versions
                and _champion(client, name) == (best or champion)):
            return best or champion, rounds
    raise RuntimeError(f"the {CHAMPION} alias of {name} did not settle in {MAX_GUARD_ROUNDS} "
                       "rounds: too many concurrent registrations")


def logged_model_uri(client: MlflowClient, run_id: str) -> str:
    """The URI of the model run `run_id` logged (`models:/m-...`: what MLflow 3 registers
    without a fallback warning); `runs:/<id>/model` for a run logged before MLflow 3."""
    run = client.get_run(run_id)
    found = mlflow.search_logged_models(
        experiment_ids=[run.info.experiment_id], output_format="list",
        filter_string=f"source_run_id = '{run_id}' and name = 'model'")
    return found[0].model_uri if found else f"runs:/{run_id}/model"


# What mlflow.register_model prints on stderr about work the command reports itself.
REGISTRATION_CHATTER = ("Successfully registered model", "Created version",
                        "already exists. Creating a new version")


def register_and_promote(model_uri: str, name: str, run_id: str, val_rmse: float,
                         rescore: Callable[[str], tuple[float | None, str]] | None = None,
                         promote: bool = True) -> dict:
    """Register `model_uri` as a new, described version of `name` (unless run `run_id` has
    one already), then, when `promote`, offer it the champion alias (`decide`); what happened
    is recorded as tags on the run and on the version. `rescore(champion_run_id)` scores the
    champion on this run's engines where their evidence differs."""
    client = MlflowClient()
    run = client.get_run(run_id)
    registered = [v for v in _versions(client, name) if _run_of(v) == run_id]
    if registered:  # a run is registered once: a resumed run that was keeps its version and
        version = min(registered, key=lambda v: int(v.version))  # figure, and gains the tags
        for key, value in version_tags(run, val_rmse).items():  # its run logged since
            if key not in version.tags:
                client.set_model_version_tag(name, version.version, key, value)
    else:
        with said_in_one_line(REGISTRATION_CHATTER):  # the command says it in its own words
            version = mlflow.register_model(model_uri, name, tags=version_tags(run, val_rmse))
    client.update_model_version(name, version.version, description=version_description(
        run, val_rmse, recorded_engines(run_id)))
    _describe_model(client, name, model_uri, run)

    previous_version = _champion(client, name)  # what this version competes with
    if previous_version == str(version.version):  # a concurrent run already moved it here
        previous_version = None
    previous = None
    if previous_version is not None:
        previous = _val_rmse_by_version(client, name, run_id).get(previous_version, math.inf)
    champion, rounds, reason = (decide(client, name, str(version.version), run_id, rescore)
                                if promote else (previous_version, 0, NOT_OFFERED))
    promoted = champion == str(version.version)
    record = {"registered_model": name, "registered_version": version.version,
              "champion_promoted": str(promoted).lower(),
              "champion_previous_version": previous_version or "none",
              "champion_previous_val_rmse": "none" if previous is None else repr(previous),
              "champion_version": champion or "none", "champion_guard_rounds": str(rounds),
              "champion_reason": reason}
    for key, value in record.items():
        client.set_tag(run_id, key, value)
    for key in ("champion_promoted", "champion_reason"):
        client.set_model_version_tag(name, version.version, key, record[key])
    return record


NOT_OFFERED = "not offered the alias (a study's promote: true offers its best)"


def registry_line(record: dict) -> str:
    """What a registration did (register_and_promote's record, or the run's tags that keep
    it), in one line: the version, where the champion alias is, and why."""
    champion = record.get("champion_version", "none")
    where = "no champion" if champion == "none" else f"champion: version {champion}" + (
        " (this version)" if record.get("champion_promoted") == "true" else "")
    return (f"registered {record['registered_model']} version {record['registered_version']}; "
            f"{where}: {record.get('champion_reason', 'n/a')}")


def decide(client: MlflowClient, name: str, version: str, run_id: str,
           rescore: Callable[[str], tuple[float | None, str]] | None
           ) -> tuple[str | None, int, str]:
    """(champion, guard rounds, why) once `version` (run `run_id`'s) was offered the alias:
    against versions of its own evidence by their selection scores (move_champion); against a
    champion of other evidence only by `rescore`, the champion's score on its engines."""
    own = key_of(client.get_model_version(name, version).tags)
    champion = _champion(client, name)
    champion_tags = client.get_model_version(name, champion).tags if champion else {}
    if champion is None or champion == version or key_of(champion_tags) == own:
        best, rounds = move_champion(client, name, run_id, own)
        return best, rounds, ("the best of the versions scored on the same engines, score and "
                              "data" if best == version else
                              f"version {best} scores better on the same engines")
    if own is None:
        return champion, 0, "this version has no selection evidence (rul promote moves it)"
    if key_of(champion_tags) is None:
        return champion, 0, (f"champion version {champion} has no selection evidence (an earlier "
                             "rul's): compare them with rul promote")
    value, why = None, "its evidence differs and the champion cannot be scored on it here"
    if rescore is not None:
        value, why = rescore(_run_of(client.get_model_version(name, champion)))
    if value is None:
        return champion, 0, f"not comparable with champion version {champion}: {why}"
    mine = float(client.get_model_version(name, version).tags["selection.rmse"])
    if mine < value:
        client.set_registered_model_alias(name, CHAMPION, version)
        return version, 1, (f"champion version {champion}, {why}, scored {value:.3f} against "
                            f"this version's {mine:.3f}")
    return champion, 0, (f"champion version {champion}, {why}, scored {value:.3f}, not worse "
                         f"than this version's {mine:.3f}")

