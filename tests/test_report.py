"""`rul report`: the Results and Performance pages generated from a store of evaluation runs
and the benches' JSON results.

One tiny `rul evaluate` (2 seeds, 1 epoch, synthetic C-MAPSS files) makes the store; an older
evaluation run without machine tags is logged beside it by hand. The tables are checked
against the runs' own logged values, and each row's command against the evaluated config.
"""

import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from rul import config as cfg
from rul.cli import main
from rul.config.recipes import PLACE_KEYS
from rul.machine import machine_tags
from rul.tracking.metric_names import logged
from rul.tracking.run_params import config_from_params
from rul.workflows.evaluate import evaluate_seeds

ROOT = Path(__file__).resolve().parents[1]
TINY = {"epochs": 1, "filters": 4, "num_layers": 2, "hidden_size": 16, "window": 10,
        "micro_batch_size": 64, "accumulation_steps": 1, "patience": 5}


@pytest.fixture(scope="module")
def store(tmp_path_factory, mlflow_store_at):
    from conftest import frame_to_text, synthetic_frame

    root = tmp_path_factory.mktemp("report")
    data = root / "cmapss"
    data.mkdir()
    (data / "train_FD001.txt").write_text(frame_to_text(synthetic_frame((52, 60, 35, 47, 41))))
    (data / "test_FD001.txt").write_text(frame_to_text(synthetic_frame((31, 45, 22, 38), 1)))
    (data / "RUL_FD001.txt").write_text("".join(f"{10 + 7 * i} \n" for i in range(4)))
    with mlflow_store_at(root) as fresh:
        config = cfg.load(ROOT / "experiments" / "fd001_age.yaml",
                          {**TINY, "tracking_uri": fresh.uri, "data_dir": str(data),
                           "checkpoint_dir": str(root / "ckpt")})
        evaluation = evaluate_seeds(config, 2, progress=False)
        client = MlflowClient(tracking_uri=fresh.uri)
        old = _old_evaluation_run(client, config)
        docs = root / "docs"
        docs.mkdir()
        yield SimpleNamespace(uri=fresh.uri, client=client, config=config, data=data, docs=docs,
                              parent=client.get_run(evaluation.parent_run_id), old=old,
                              root=root)


def _old_evaluation_run(client, config) -> str:
    """An evaluation parent as an older rul logged it: no seed runs with machine tags."""
    experiment = client.get_experiment_by_name(config.experiment_name).experiment_id
    run = client.create_run(experiment, run_name="evaluate-old-x3",
                            tags={"rul.kind": "evaluate", "rul.seeds": "7,8,9"})
    params = {**{k: str(v) for k, v in config.replace(include_cycle=False, seed=7).to_dict()
                 .items() if v is not None}, "seeds": "3"}
    for key, value in params.items():
        client.log_param(run.info.run_id, key, value)
    for key, value in {"test_rmse_mean": 30.5, "test_rmse_std": 1.25, "val_rmse_mean": 29.0,
                       "val_rmse_std": 2.0}.items():
        client.log_metric(run.info.run_id, key, value)
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def _report(store, *args):
    return CliRunner().invoke(main, ["report", "--tracking-uri", store.uri,
                                     "--out", str(store.docs), *args])


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split(" | ")]


def _row(page: str, first_cell: str = "", source: str = "") -> list[str]:
    """A result's cells: its figures, then where and how it was measured (the rows of the two
    tables with the same number), less the numbers; the first row whose config starts with
    `first_cell` and whose source is `source`."""
    lines = page.splitlines()
    for line in lines:
        cells = _cells(line)
        if len(cells) == 8 and cells[0].isdigit() and cells[1].startswith(f"`{first_cell}"):
            number = cells[0]
            start = lines.index(line)
            provenance = next(_cells(x) for x in lines[start:] if _cells(x)[0] == number
                              and _cells(x) != cells)
            if provenance[6].startswith(source):
                return cells[1:] + provenance[1:]
    raise AssertionError(f"no row {first_cell!r} from {source!r}")


@pytest.fixture(scope="module")
def pages(store):
    seed_run = store.client.search_runs(
        [store.parent.info.experiment_id],
        f"tags.`mlflow.parentRunId` = '{store.parent.info.run_id}'")[0]
    result = _report(store, "--model", f"runs:/{seed_run.info.run_id}/model",
                     "--data-dir", str(store.data))
    assert result.exit_code == 0, result.output
    return SimpleNamespace(results=(store.docs / "results.md").read_text(),
                           performance=(store.docs / "performance.md").read_text(),
                           output=result.output)


def test_the_evaluation_is_a_row_of_its_track_with_its_logged_figures(store, pages):
    metrics = store.parent.data.metrics
    age = pages.results.split("## Sensors + engine age")[1].split("\n## ")[0]
    row = _row(age, source=f"run {store.parent.info.run_id[:8]}")
    assert row[1] == "2: 42, 43" and "2 seed(s): indicative only" in row[0]
    assert row[2] == f"{metrics['val/rmse_mean']:.2f} ± {metrics['val/rmse_std']:.2f}"
    rmse = metrics[logged("test_rmse_mean")], metrics[logged("test_rmse_std")]
    score = metrics[logged("test_score_mean")], metrics[logged("test_score_std")]
    assert row[3] == f"**{rmse[0]:.2f} ± {rmse[1]:.2f}**"
    assert row[5] == f"{score[0]:.0f} ± {score[1]:.0f}"
    tags = machine_tags()
    assert row[7].startswith(f"{tags['cpu_model']}, {tags['cpu_count']} CPUs")
    assert ("(native bf16)" in row[7]) == (tags["cpu_native_bf16"] == "true")
    assert row[8] in ("fp32", "bf16") and row[9] == tags["torch_version"]
    assert row[10].startswith(store.parent.data.tags["mlflow.source.git.commit"][:7])
    assert row[12] == f"run {store.parent.info.run_id[:8]}"


def test_each_rows_command_reproduces_the_evaluated_config(store, pages):
    row = _row(pages.results, source=f"run {store.parent.info.run_id[:8]}")
    words = shlex.split(row[-1].strip("`"))
    assert words[:2] == ["rul", "evaluate"] and words[3:5] == ["--seeds", "2"]
    rebuilt = cfg.load(ROOT / words[2], words[5:])
    evaluated = config_from_params(store.parent.data.params)
    assert {k: v for k, v in rebuilt.model_dump().items() if k not in PLACE_KEYS} == {
        k: v for k, v in evaluated.model_dump().items() if k not in PLACE_KEYS}


def test_an_older_run_without_machine_tags_shows_n_a(store, pages):
    sensors = pages.results.split("## Sensors only")[1].split("\n## ")[0]
    row = _row(sensors, source=f"run {store.old[:8]}")
    assert row[1] == "3: 7–9" and row[3] == "**30.50 ± 1.25**"
    assert row[7:10] == ["n/a", "n/a", "n/a"]
    assert "seed=7" in row[-1]


def test_the_recorded_results_sit_beside_the_runs(pages):
    side = pages.results.split("## Side by side")[1].split("\n## ")[0]
    row = _cells(next(line for line in side.splitlines()
                      if line.startswith("| `fd001_b32_e150.yaml`")))
    assert row[1].startswith("11.87 ± 0.25") and row[2].startswith("11.03 ± 0.29")
    assert "| recorded |" in pages.results
    assert "<!-- Generated by `rul report" in pages.results


def test_the_figures_are_drawn_from_the_logged_model(store, pages):
    for name in ("predicted_vs_true.png", "rul_trajectories.png"):
        path = store.docs / "assets" / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"](assets/{name})" in pages.results


def test_bench_json_becomes_a_performance_table(store, pages, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))  # bench/ is a folder of the checkout, not installed
    from bench.__main__ import write_result

    folder = tmp_path / "bench"
    write_result(folder, "speed", {"columns": ["path", "samples/s"],
                                   "rows": [["cpu fp32 eager", 1234]],
                                   "summary": {"speed ratio": 1.5}}, ["speed"])
    result = _report(store, "--bench-dir", str(folder))
    assert result.exit_code == 0, result.output
    page = (store.docs / "performance.md").read_text()
    speed = page.split("## Speed of the training step")[1].split("\n## ")[0]
    first = speed.split("| path | samples/s |")[0]
    assert machine_tags()["cpu_model"] in first and "`python -m bench speed`" in first
    assert "| cpu fp32 eager | 1234 |" in speed and "speed ratio: **1.5**" in speed
    # no model this time, no champion in the store: the figures drawn before stay on the page
    assert "](assets/rul_trajectories.png)" in (store.docs / "results.md").read_text()


def test_a_missing_store_is_one_line_and_writes_nothing(tmp_path):
    result = CliRunner().invoke(main, ["report", "--tracking-uri",
                                       f"sqlite:///{tmp_path}/none.db", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.strip() == (f"Error: sqlite:///{tmp_path}/none.db: no MLflow store "
                                     "there (set --tracking-uri or MLFLOW_TRACKING_URI)")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_fleets_evaluation_has_its_own_section_not_fd001s_tables():
    from rul.reporting.pages import results_page
    from rul.reporting.records import ResultRecord

    def record(dataset, rmse):
        return ResultRecord(config=f"{dataset}.yaml", include_cycle=False, recipe=dataset,
                            seeds=[0, 1], metrics={"test_rmse": (rmse, 0.5)}, machine="m",
                            precision="fp32", torch="2.13.0", commit="abc1234",
                            date="2026-11-28", command=f"rul evaluate {dataset}.yaml",
                            source="run 1234abcd", dataset=dataset)

    page = results_page([record("FD001", 12.5), record("fleet", 17.25)], [], "rul report",
                        "mlflow.db", [])
    fd001, fleet = page.split("## Data set `fleet`")
    assert "17.25" not in fd001 and "12.50" in fd001.split("## Sensors only")[1]
    assert "17.25" in fleet.split("### Sensors only")[1] and "12.50" not in fleet
    assert "published" not in fleet and "not comparable with FD001's" in fleet


def test_engines_in_service_have_their_section_with_the_share_of_the_gap_closed():
    """docs/data/in_service.yaml's four rows, their means, and how much of the gap between
    dropping the engines in service and running all to failure the lower-bound loss closes."""
    from rul.reporting.pages import Appendices, results_page

    def row(name, changes, rmse):
        return {"name": name, "overrides": changes, "seeds": [42, 43], "test_rmse": rmse,
                "val_rmse": [11.0, 12.0], "seconds": [100.0, 120.0]}

    record = {"command": "python tools/in_service_study.py", "machine": "m", "commit": "abc1234",
              "date": "2026-12-02",
              "in_service": {"engines": 50, "of": 100, "life_seen": [0.3, 0.8], "draw_seed": 0},
              "rows": [row("dropped", {"censored_training": "dropped"}, [14.0, 14.0]),
                       row("known", {"censored_training": "known"}, [13.5, 13.5]),
                       row("bound", {"censored_training": "lower_bound"}, [12.4, 12.6]),
                       row("all failed", {"subset": "FD001"}, [12.0, 12.0])]}
    page = results_page([], [], "rul report", "x", [], Appendices(in_service=record))
    section = page.split("## Engines still in service")[1]
    assert "| bound | `censored_training: lower_bound` | 12.50 ± 0.14 |" in section
    assert "| all failed | FD001 itself | 12.00 ± 0.00 |" in section
    assert "is 2.00 cycles of test RMSE; today's rule closes 25 % of it." in section
    assert "The lower-bound loss closes 75 % of it, against a goal of 50 %." in section
    assert "a lower validation RMSE on 0 of 2 seeds and a lower test RMSE on 2 of 2." in section
    record["rows"][2]["test_rmse"] = [13.6, 13.6]
    page = results_page([], [], "rul report", "x", [], Appendices(in_service=record))
    assert "The lower-bound loss closes 20 % of it, against a goal of 50 %: short of it, so " \
           "the mode stays opt-in" in page
    assert "## Engines still in service" not in results_page([], [], "rul report", "x", [])


def test_side_by_side_shows_a_recipes_most_complete_row_among_those_of_most_seeds():
    """Two recorded rows of one recipe and seeds (two machines): the one whose figures were
    all kept, not the one with the lower test RMSE; more seeds still come first."""
    from rul.reporting.pages import side_by_side
    from rul.reporting.records import ResultRecord

    def record(rmse, seeds, metrics):
        return ResultRecord(config="fd001.yaml", include_cycle=False, recipe="r", seeds=seeds,
                            metrics={"test_rmse": (rmse, 0.2), **metrics}, machine="m",
                            precision="fp32", torch="2.13.0", commit="abc1234",
                            date="2026-11-29", command="rul evaluate fd001.yaml",
                            source="recorded")

    whole = {"val_rmse": (11.08, 0.6), "test_mae": (8.5, 0.1)}
    few = record(11.88, [1, 2, 3, 4, 5], {"val_rmse": (11.09, None)})
    kept = record(11.97, [1, 2, 3, 4, 5], whole)
    (row,) = [line for line in side_by_side([few, kept]) if line.startswith("| `fd001")]
    assert "11.97 ± 0.20 (val 11.08 ± 0.60; 5 seeds)" in row
    more = record(12.5, list(range(10)), {})
    (row,) = [line for line in side_by_side([few, kept, more]) if line.startswith("| `fd001")]
    assert "12.50 ± 0.20" in row and "10 seeds" in row


def test_a_data_sections_params_rebuild_its_config():
    from rul.tracking.run_params import config_params

    config = cfg.load(ROOT / "experiments" / "fleet.yaml", {"epochs": 3})
    assert config_from_params(config_params(config)) == config


def test_make_train_is_a_table_by_machine_with_where_and_when_each_was_measured():
    """`python -m bench accuracy` results and the recorded `make train` ones: one row per
    machine, the fastest first, with its precision, torch, commit and date; none: no table."""
    from rul.reporting.benches import BenchResult
    from rul.reporting.pages import TRAIN_ANCHOR, performance_page, train_times

    def measured(bench, machine, seconds, commit):
        return BenchResult(bench, "python -m bench accuracy" if bench == "accuracy"
                           else "make train", machine, "2.13.0+cpu", commit, "2026-11-28", [],
                           [], {"wall time (s)": seconds, "test RMSE": 12.1,
                                "precision": "fp32"}, source="x.json")

    results = [measured("accuracy", "Intel Xeon, 2 CPUs, avx512_bf16", 250, "abc1234"),
               measured("make train", "AMD EPYC, 2 CPUs", 115.5, "def5678"),
               BenchResult("speed", "python -m bench speed", "AMD EPYC", "2.13.0", "1", "d",
                           ["path"], [["x"]])]
    lines = train_times(results)
    assert lines[0] == f"## `make train` by machine {{#{TRAIN_ANCHOR}}}"
    rows = [line for line in lines if line.startswith("| ") and "2026-11-28" in line]
    assert [row.split(" | ")[0] for row in rows] == ["| AMD EPYC, 2 CPUs",
                                                      "| Intel Xeon, 2 CPUs, avx512_bf16"]
    assert rows[1] == ("| Intel Xeon, 2 CPUs, avx512_bf16 | fp32 | 250 s | 12.1 | 2.13.0+cpu | "
                       "abc1234 | 2026-11-28 | `python -m bench accuracy` |")
    page = performance_page(results, [], "rul report")
    assert page.count("abc1234") == 1  # in the table, not again under "Other benches"
    assert train_times(results[2:]) == []


def test_a_bench_accuracy_result_is_a_row_of_the_make_train_table(tmp_path):
    """What `python -m bench accuracy --json DIR` writes, read back by `rul report`."""
    from bench.__main__ import accuracy_result, write_result
    from rul.reporting.benches import read_bench_folder
    from rul.reporting.pages import train_times

    figures = {"test RMSE": 12.55, "score": 304.3, "best epoch": 100, "wall time (s)": 351,
               "precision": "fp32"}
    write_result(tmp_path, "accuracy", accuracy_result(figures), [])
    rows = [line for line in train_times(read_bench_folder(tmp_path)) if "351 s" in line]
    assert len(rows) == 1 and "| fp32 | 351 s | 12.55 |" in rows[0]



def test_the_first_screen_says_what_make_train_scores_the_best_validation_and_the_range():
    """Before any table: `make train`'s figure (its row of most seeds), the lowest validation
    RMSE of the sensors-only rows with its test figure, the published range and what the
    interval and p_fail are; each row's measurement story folded under the row."""
    from rul.reporting.pages import results_page
    from rul.reporting.records import ResultRecord

    def record(config, val, test, seeds=5, include_cycle=False, note=""):
        return ResultRecord(config=config, include_cycle=include_cycle, recipe=config,
                            seeds=list(range(seeds)),
                            metrics={"val_rmse": (val, 0.5), "test_rmse": (test, 0.2),
                                     "test_interval_coverage": (0.9, 0.01),
                                     "test_interval_width": (33.0, 1.0)},
                            machine="AMD EPYC, 2 CPUs", precision="fp32", torch="2.13.0",
                            commit="abc1234", date="2026-12-02", command=f"rul evaluate {config}",
                            source="recorded", note=note)

    page = results_page([record("fd001.yaml", 11.08, 11.97, note="a long story " * 20),
                         record("fd001_b32.yaml", 10.39, 11.75),
                         record("fd001.yaml + val_weights=truncation", 9.0, 12.5),
                         record("few.yaml", 8.0, 13.0, seeds=3),
                         record("fd001_age.yaml", 7.0, 10.9, include_cycle=True)],
                        [], "rul report", "mlflow.db", [])
    first = page.split("## How to read the rows")[0]
    assert first.index("## At a glance") < first.index("`make train`")
    assert "test RMSE **11.97 ± 0.20** over 5 seeds" in first
    assert "holds 90% of the test engines, 33.0 cycles wide" in first
    assert "`fd001_b32.yaml`: val 10.39 ± 0.50, test RMSE **11.75 ± 0.20**" in first
    assert "11.6–12.3" in first and "p_fail_within" in first and "| " not in first
    assert "<details><summary>how it was measured</summary><small>a long story" in page
