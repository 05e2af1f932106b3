"""The Studies section of the Results page from docs/data/studies.yaml: the recorded studies
read back whole, a bad entry is one line naming it, and the table orders and marks trials."""

from pathlib import Path

import pytest
import yaml

from rul import config as cfg
from rul.reporting.pages import Appendices, results_page
from rul.reporting.studies import StudyRecord, Trial, read_recorded_studies

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "docs" / "data" / "studies.yaml"


@pytest.mark.parametrize(("name", "trials", "counts", "best", "adopted_by"), [
    ("rul-fd001-b512-recipe", 24, {"COMPLETE": 4, "PRUNED": 17, "FAIL": 3}, (6, 11.1622),
     "experiments/fd001_b512_adamw.yaml"),
    ("rul-fd001-b512-muon", 12, {"COMPLETE": 3, "PRUNED": 9}, (2, 10.8681), ""),
    ("rul-fd001-b512-muon-regular", 16, {"COMPLETE": 6, "PRUNED": 10}, (7, 10.6569),
     "experiments/fd001.yaml"),
    ("rul-fd001-b512-muon-seeds", 14, {"COMPLETE": 4, "PRUNED": 8, "FAIL": 2}, (6, 11.0331),
     ""),
    ("rul-fd001-b512-muon-arch", 10, {"COMPLETE": 4, "PRUNED": 6}, (4, 10.9264),
     "experiments/fd001.yaml"),
    ("rul-fd001-muon-batch", 18, {"COMPLETE": 10, "FAIL": 8}, (7, 11.2267), ""),
])
def test_the_recorded_studies_behind_make_trains_recipes_are_read_whole(name, trials, counts,
                                                                         best, adopted_by):
    (study,) = [s for s in read_recorded_studies(RECORDED) if s.name == name]
    assert len(study.trials) == trials
    assert study.counts() == counts
    assert study.best.number == best[0] and study.best.value == pytest.approx(best[1], abs=1e-4)
    assert study.adopted_by == adopted_by
    if adopted_by:  # the adopted recipe holds the best trial's values
        train = cfg.load(ROOT / study.adopted_by)
        for key, value in study.best.params.items():  # rates and dropout rounded to 3 digits
            assert getattr(train, key) == (pytest.approx(value, rel=1e-2)
                                           if isinstance(value, float) else value), key
    assert set(study.search_space) == set(study.best.params)
    assert (ROOT / study.config).is_file()
    tuning = cfg.load_tuning(ROOT / study.config)
    assert study.seeds_per_trial == tuning.seeds_per_trial
    # the recipe scored in place: trial 0 exactly where the study's config asks for it
    baseline = [t.number for t in study.trials if t.baseline]
    assert baseline == ([0] if tuning.baseline_trial else [])


@pytest.mark.parametrize(("change", "said"), [
    (lambda e: e.pop("trials"), "study 1: 'trials'"),
    (lambda e: e["trials"][0].update(state="DONE"), "unknown trial state 'DONE'"),
    (lambda e: e["trials"][0].update(value="low"), "study 1: could not convert"),
])
def test_a_bad_recorded_study_is_one_line_naming_it(tmp_path, change, said):
    entry = {"name": "s", "search_space": {"lr": {"type": "float", "low": 0.1, "high": 1}},
             "trials": [{"number": 0, "state": "COMPLETE", "value": 1.0, "params": {"lr": 0.2}}]}
    change(entry)
    path = tmp_path / "studies.yaml"
    path.write_text(yaml.safe_dump({"studies": [entry]}))
    with pytest.raises(cfg.ConfigError) as error:
        read_recorded_studies(path)
    assert str(error.value).startswith(f"{path}: ") and said in str(error.value)
    assert "\n" not in str(error.value)


def test_the_page_lists_complete_trials_by_value_first_and_marks_the_best():
    trials = [Trial(0, "PRUNED", 15.2, 20, {"lr": 0.005}, "pruned at epoch 20"),
              Trial(1, "COMPLETE", 11.8, 100, {"lr": 0.0144}),
              Trial(2, "FAIL", None, 3, {"lr": 0.001}, "interrupted (SIGINT)"),
              Trial(3, "COMPLETE", 11.2, 150, {"lr": 0.0108})]
    study = StudyRecord("demo", {"lr": {"type": "float", "low": 0.002, "high": 0.02,
                                        "log": True}}, trials, "a machine", "abc1234",
                        "2026-11-28", "recorded", config="experiments/tune_demo.yaml",
                        adopted_by="experiments/demo.yaml")
    page = results_page([], [], "rul report", "sqlite:///mlflow.db", [], Appendices([study]))
    section = page.split("## Studies")[1]
    assert ("`rul tune experiments/tune_demo.yaml`: 4 trials (2 complete, 1 pruned, 1 failed)"
            in section)
    assert "Searched: lr 0.002–0.02 (log). Best: trial 3, val RMSE 11.20, adopted by " \
           "`experiments/demo.yaml`." in section
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row.split(" | ")[0] for row in rows[1:]] == ["| **3**", "| 1", "| 0", "| 2"]
    assert rows[4].startswith("| 2 | failed | n/a | 3 | 0.001 | interrupted (SIGINT)")
    assert "## Studies" not in results_page([], [], "rul report", "x", [], Appendices([]))
