"""`rul promote`: a registered version beside the champion on the same engines, and the alias
moved by hand, who decided and why kept on the version (docs: Predict and serve, Promotion)."""

import getpass
import time

import mlflow
from mlflow.tracking import MlflowClient

from rul.data import load_dataset
from rul.errors import ConfigError
from rul.tracking.registry import CHAMPION, _run_of
from rul.tracking.run_params import config_from_params
from rul.tracking.selection import ENGINES_FILE, TAGS, Challenger, key_of, rescored


def challenger_of(run_id: str, client: MlflowClient) -> Challenger:
    """A version's run as a challenger: its validation engines (engines.json) and the rows of
    the data set it trained on, read again from its files."""
    run = client.get_run(run_id)
    config = config_from_params(run.data.params)
    engines = mlflow.artifacts.load_dict(f"runs:/{run_id}/{ENGINES_FILE}")["validate"]
    subset = load_dataset(config.dataset, config.data_dir, limit=config.data_limit)
    return Challenger(tuple(engines), subset.train, config.val_weights,
                      int(run.data.tags["seed.split"]))


def side_by_side(name: str, version: str, client: MlflowClient | None = None) -> list[str]:
    """Lines comparing `version` of `name` with its champion: each one's evidence and figures,
    then the champion's score on the version's engines where their evidence differs."""
    client = client or MlflowClient()
    found = _version(client, name, version)
    champion = client.get_registered_model(name).aliases.get(CHAMPION)
    rows = [("challenger", found)] + ([("champion", _version(client, name, str(champion)))]
                                      if champion is not None else [])
    lines = [f"{'':11}{'version':>8} {'selection RMSE':>15} {'test RMSE':>10}  "
             "engines (digest, count)   data      score"]
    for role, v in rows:
        t = v.tags
        engines = f"{t.get('selection.engines', 'none')} {t.get('selection.engine_count', '?'):>4}"
        lines.append(f"{role:11}{v.version:>8} {t.get('selection.rmse', 'n/a')[:8]:>15} "
                     f"{t.get('test_rmse', 'n/a')[:8]:>10}  {engines}  "
                     f"{t.get('selection.data', 'none')[:8]}  {t.get('selection.score', 'none')}")
    if champion is None or str(champion) == version:
        return lines + [f"version {version} {'is' if champion else 'has no'} champion"]
    mine, theirs = key_of(found.tags), key_of(rows[1][1].tags)
    if mine is not None and mine == theirs:
        return lines + ["the same engines, score and data: compare their selection RMSE"]
    try:
        value, why = rescored(_run_of(rows[1][1]), challenger_of(_run_of(found), client), client)
    except (KeyError, OSError, ConfigError, mlflow.exceptions.MlflowException) as error:
        value, why = None, f"the version's engines or data cannot be read back ({error})"
    said = (f"the champion on version {version}'s engines: {value:.3f} ({why})"
            if value is not None else f"no comparable score for the champion: {why}")
    return lines + [said]


def promote(name: str, version: str, why: str, client: MlflowClient | None = None) -> str:
    """Move the champion alias of `name` to `version` by hand: who, why and when kept on the
    version's tags; the line that says so."""
    client = client or MlflowClient()
    _version(client, name, version)
    before = client.get_registered_model(name).aliases.get(CHAMPION)
    client.set_registered_model_alias(name, CHAMPION, version)
    for key, value in {"promoted.by": getpass.getuser(), "promoted.why": why,
                       "promoted.at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                       "promoted.from": str(before) if before is not None else "none",
                       "champion_reason": f"promoted by hand: {why}"}.items():
        client.set_model_version_tag(name, version, key, value)
    return f"{name}@{CHAMPION} is version {version} (was {before if before else 'none'})"


def _version(client: MlflowClient, name: str, version: str):
    try:
        return client.get_model_version(name, version)
    except mlflow.exceptions.MlflowException:
        raise ConfigError(f"{name} has no version {version}") from None


__all__ = ["TAGS", "promote", "side_by_side"]
