"""`rul report`: write the Results and Performance pages (and their figures) from an MLflow store
and the benches' JSON results."""

import json
import os
import shlex
import tempfile
from pathlib import Path

import click

from rul.files import write_whole

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RECORDED_RESULTS = DOCS / "data" / "results.yaml"
RECORDED_BENCHES = DOCS / "data" / "performance.yaml"
RECORDED_STUDIES = DOCS / "data" / "studies.yaml"
RECORDED_IN_SERVICE = DOCS / "data" / "in_service.yaml"  # tools/in_service_study.py
CHAMPION = "models:/rul-fd001@champion"


class ReportError(click.ClickException):
    exit_code = 2


class StoreUnreachable(click.ClickException):
    exit_code = 3


def shown(value: str) -> str:
    """A store URI or a folder as the generated pages show it: relative to the working folder
    when it lies inside it, else its folder as a placeholder; never this machine's absolute
    path (`sqlite:////home/me/runs/mlflow.db` -> `sqlite:///<folder>/mlflow.db`)."""
    prefix = "sqlite:///" if value.startswith("sqlite:///") else ""
    path = value.removeprefix(prefix)
    if not os.path.isabs(path):
        return value
    relative = os.path.relpath(path, os.getcwd())
    if not relative.startswith(".."):
        return prefix + relative
    return f"{prefix}<folder>/{os.path.basename(path.rstrip('/'))}"


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    from rul.tracking_uri import absent_store, for_mlflow

    why = absent_store(uri)
    if why:
        raise ReportError(why)
    return MlflowClient(tracking_uri=for_mlflow(uri))


def _figures(model_uri: str, explicit: bool, data_dir, out: Path) -> list[tuple[str, str]]:
    """Draw the figures of `model_uri` into out/assets; the champion may be absent (then no
    figures, said on stderr), a model named with --model may not."""
    import mlflow

    from rul.data import load_subset
    from rul.reporting.figures import draw

    try:
        model = mlflow.pyfunc.load_model(model_uri)
    except mlflow.exceptions.MlflowException as error:
        if explicit:
            raise ReportError(f"--model {model_uri}: {error.message}") from None
        kept = _drawn_before(out)
        click.echo(f"{model_uri} is not in this store: "
                   f"{'the figures drawn before are kept' if kept else 'no figures'} (pass "
                   "--model runs:/<run id>/model to draw them)", err=True)
        return kept
    subset = load_subset("FD001", data_dir)
    assets = out / "assets"
    with tempfile.TemporaryDirectory() as scratch:
        drawn = draw(model, subset.test, subset.test_rul, Path(scratch))
        assets.mkdir(parents=True, exist_ok=True)
        for path in drawn:
            path.replace(assets / path.name)
    figures = [("assets/predicted_vs_true.png",
                f"Predicted against true RUL at the last cycle of each FD001 test engine, with "
                f"its interval (`{model_uri}`)."),
               ("assets/rul_trajectories.png",
                "The RUL predicted at every cycle of three test engines from the rows up to it, "
                "with the interval band, against the true RUL capped at the target's cap "
                f"(`{model_uri}`).")]
    write_whole(assets / FIGURES_INDEX, json.dumps(figures, indent=1) + "\n")
    return figures


FIGURES_INDEX = "figures.json"  # the figures last drawn and their captions (with the model)


def _drawn_before(out: Path) -> list[tuple[str, str]]:
    """The figures an earlier report drew, while their files are all there."""
    index = out / "assets" / FIGURES_INDEX
    try:
        figures = [tuple(item) for item in json.loads(index.read_text())]
    except (OSError, ValueError, TypeError):
        return []
    return figures if all((out / path).is_file() for path, _ in figures) else []


@click.command()
@click.option("--tracking-uri", help="MLflow store to read (default: MLFLOW_TRACKING_URI or "
              "./mlflow.db).")
@click.option("--bench-dir", type=click.Path(file_okay=False), default=None,
              help="Folder of bench results (`python -m bench --json DIR`), e.g. bench/results.")
@click.option("--model", "model_uri", default=None,
              help=f"Logged model for the figures (default: {CHAMPION} when it exists).")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Local C-MAPSS folder.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Docs folder to write results.md, performance.md and assets/*.png into "
                   "(default: this checkout's docs/).")
def report(tracking_uri, bench_dir, model_uri, data_dir, out):
    """Write the Results and Performance pages from the evaluation runs (`rul evaluate`) of an
    MLflow store, the benches' JSON results and the recorded results in docs/data/."""
    from mlflow.exceptions import MlflowException

    from rul.config import ConfigError
    from rul.data.errors import DataError, DataUnavailableError
    from rul.reporting.benches import read_bench_folder, read_recorded_benches
    from rul.reporting.in_service import read_in_service
    from rul.reporting.pages import Appendices, performance_page, results_page
    from rul.reporting.records import read_evaluations, read_recorded
    from rul.reporting.studies import read_recorded_studies, read_studies
    from rul.tracking.store import configure, store_uri

    out = Path(out) if out else DOCS
    if not out.is_dir():
        raise ReportError(f"--out {out}: folder does not exist")
    if bench_dir and not Path(bench_dir).is_dir():
        raise ReportError(f"--bench-dir {bench_dir}: folder does not exist")
    uri = store_uri(tracking_uri)
    client = _client(uri)  # before configure: reading a store never creates one
    configure(uri, writes=False)
    command = "rul report" + "".join(
        f" {flag} {shlex.quote(shown(str(value)))}" for flag, value in
        (("--tracking-uri", tracking_uri), ("--bench-dir", bench_dir), ("--model", model_uri),
         ("--out", None if out == DOCS else out)) if value)
    try:
        records = read_evaluations(client)
        recorded, decisions = read_recorded(RECORDED_RESULTS)
        studies = read_studies(client) + read_recorded_studies(RECORDED_STUDIES)
        in_service = read_in_service(RECORDED_IN_SERVICE)
        benches = read_bench_folder(Path(bench_dir)) if bench_dir else []
        recorded_benches, bench_decisions = read_recorded_benches(RECORDED_BENCHES)
        figures = _figures(model_uri or CHAMPION, model_uri is not None, data_dir, out)
    except (ConfigError, DataError, DataUnavailableError) as error:
        raise ReportError(str(error)) from None
    except MlflowException as error:
        if uri.startswith(("http://", "https://")):
            raise StoreUnreachable(f"{uri}: {error.message}") from None
        raise ReportError(f"{uri}: {error.message}") from None
    write_whole(out / "results.md",
                results_page(records + recorded, decisions, command, shown(uri), figures,
                             Appendices(studies, in_service)))
    write_whole(out / "performance.md",
                performance_page(benches + recorded_benches, bench_decisions, command))
    click.echo(f"wrote {out / 'results.md'} ({len(records)} evaluation run(s), "
               f"{len(recorded)} recorded; {len(studies)} studies) and "
               f"{out / 'performance.md'} "
               f"({len(benches)} bench result(s), {len(recorded_benches)} recorded)"
               + (f" and {len(figures)} figures" if figures else ""))
