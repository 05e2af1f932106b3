"""One policy for odd inputs (rul.preprocessing.odd_inputs): training names each kind once,
with its units, records it on the run and trains; `strict_data` refuses the file, as `strict`
refuses a request. The table in the docs is generated from the same POLICY."""

import warnings

import numpy as np
from click.testing import CliRunner

from rul import config as cfg
from rul.cli import main
from rul.data import load_subset
from rul.plan import prepared
from rul.preprocessing.odd_inputs import POLICY
from rul.preprocessing.prepared import OddInputWarning
from rul.tracking.run_logging import data_tags

TINY = {"epochs": 1, "filters": 4, "num_layers": 2, "hidden_size": 8, "window": 20,
        "device": "cpu", "interval_coverage": None}


def odd_folder(write_cmapss, rewrite):
    """Synthetic files with every kind: a gap in unit 2, unit 3 starting at cycle 5, a far
    value in unit 4 and a constant sensor (s_1) that varies."""
    folder = write_cmapss(train_lengths=(52, 60, 35, 47, 41, 55))
    path = folder / "train_FD001.txt"
    lines = path.read_text().splitlines()
    keep = []
    for line in lines:
        unit, cycle = (int(t) for t in line.split()[:2])
        if (unit == 2 and 20 <= cycle < 27) or (unit == 3 and cycle < 5):
            continue
        keep.append(line)
    path.write_text("\n".join(keep) + "\n")
    row_of_unit_4 = next(i for i, line in enumerate(keep, start=1) if line.startswith("4 10 "))
    rewrite(path, row_of_unit_4, lambda t: t.__setitem__(12, "9999.0"))  # s_8, read
    rewrite(path, 3, lambda t: t.__setitem__(5, f"{float(t[5]) + 40:.4f}"))  # s_1, not read
    return folder


def test_training_names_each_odd_kind_once_and_records_it(write_cmapss, rewrite):
    folder = odd_folder(write_cmapss, rewrite)
    config = cfg.load(None, {**TINY, "data_dir": str(folder)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = prepared(config, 0, load_subset("FD001", folder))
    said = [str(w.message) for w in caught if issubclass(w.category, OddInputWarning)]
    assert said == [
        "training data: two rows of a unit more than one cycle apart in units 2",
        "training data: a unit's first cycle after cycle 1 in units 3",
        "training data: a value more than 20 robust standard deviations from its column's "
        "median in the training rows of its operating condition in units 4",
        "training data: s_1 vary, but the model does not read them (features: the fixed list "
        "of informative sensors)"]
    assert data.odd == {"gaps": [2], "late_start": [3], "far_values": [4],
                        "varying_unread": ["s_1"]}
    tags = data_tags(data)
    assert (tags["data.odd.gaps"], tags["data.odd.late_start"], tags["data.odd.far_values"],
            tags["data.odd.varying_unread"]) == ("2", "3", "4", "s_1")


def test_strict_data_refuses_the_file_in_one_line(write_cmapss, rewrite, tmp_path):
    folder = odd_folder(write_cmapss, rewrite)
    result = CliRunner().invoke(main, [
        "train", *[f"{k}={'null' if v is None else v}" for k, v in TINY.items()],
        "strict_data=true", f"data_dir={folder}",
        f"tracking_uri=sqlite:///{tmp_path}/mlflow.db", "--no-progress"])
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith(f"Error: {folder}/train_FD001.txt: two rows of a unit more than one "
                           "cycle apart in units 2; a unit's first cycle after cycle 1 in units "
                           "3; a value more than 20")
    assert line.endswith("(strict_data=true refuses them; without it they are named and "
                         "trained on)")
    assert not (tmp_path / "mlflow.db").exists()


def test_the_real_training_file_has_no_odd_input(fd001):
    config = cfg.load(None, {"data_dir": None})
    with warnings.catch_warnings():
        warnings.simplefilter("error", OddInputWarning)
        assert prepared(config, 0, fd001).odd == {}
    with warnings.catch_warnings():  # all 21: its constant sensors are constant in test too
        warnings.simplefilter("ignore", OddInputWarning)
        assert "varying_in_test" not in prepared(config.replace(features="all"), 0,
                                                     fd001).odd


def test_a_read_sensor_that_varies_only_in_the_test_file_is_named_in_training(write_cmapss,
                                                                              rewrite):
    """features=all reads s_1, constant in the training rows: varying in the test file, it
    is scaled far out of range there (test RMSE 23.98 -> 28.27 on FD001, unsaid before)."""
    folder = write_cmapss()
    rewrite(folder / "test_FD001.txt", 3, lambda t: t.__setitem__(5, f"{float(t[5]) + 40:.4f}"))
    config = cfg.load(None, {**TINY, "data_dir": str(folder), "features": "all"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = prepared(config, 0, load_subset("FD001", folder))
    said = [str(w.message) for w in caught if issubclass(w.category, OddInputWarning)]
    assert said == ["test data: s_1 vary, but not in the training rows: the model learned "
                    "nothing from them and their test values are scaled far out of range (drop "
                    "them from features, or drop_constant: true)"]
    assert data.odd == {"varying_in_test": ["s_1"]}
    assert data_tags(data)["data.odd.varying_in_test"] == "s_1"
    assert prepared(config.replace(features="informative"), 0,
                        load_subset("FD001", folder)).odd == {}  # s_1 is not read


def test_every_kind_says_what_training_and_serving_do():
    assert [k.key for k in POLICY] == ["gaps", "repeated_cycles", "late_start", "far_values",
                                       "varying_unread", "varying_in_test"]
    assert all(k.found and k.training and k.serving for k in POLICY)
    assert np.unique([k.key for k in POLICY]).size == len(POLICY)


def test_the_docs_table_is_generated_from_the_policy():
    from rul.reference import odd_inputs_reference

    page = odd_inputs_reference()
    assert all(f"| `{k.key}` |" in page for k in POLICY)
    assert "strict_data" in page and "data.odd.<kind>" in page
