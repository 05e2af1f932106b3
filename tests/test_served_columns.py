"""The served columns have one table (rul.serving.columns): the output signature, the frame
every prediction path returns, the registered model's description and the serve guide's table
all follow it, and it loads with the standard library alone (the lean served model imports
it)."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import synthetic_frame

from rul.evaluation.conformal import Interval, fit_banded
from rul.preprocessing import Preprocessor
from rul.serving import columns
from rul.serving.columns import COLUMNS, GIVEN, Column, served
from rul.serving.predictor import ServedModel, predict_rows
from rul.serving.signature import signature
from rul.tracking.registry import model_description

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "guides" / "serve.md"
TABLE_START = ("<!-- columns: generated from rul/serving/columns.py by "
               "tests/test_served_columns.py -->")
TABLE_END = "<!-- columns end -->"

# Each kind of model: (its interval's method, members, envelope)
KINDS = {"banded, one network": ("banded", 1, True),
         "banded ensemble": ("banded", 2, True),
         "absolute interval": ("absolute", 1, True),
         "no interval": (None, 1, True),
         "ensemble, no envelope (an old model)": ("absolute", 3, False)}
# What each MLflow type is in the returned frame
DTYPE_OF = {"long": pd.api.types.is_int64_dtype, "double": pd.api.types.is_float_dtype,
            "boolean": pd.api.types.is_bool_dtype, "string": pd.api.types.is_string_dtype}


@pytest.fixture(scope="module")
def fitted():
    rows = synthetic_frame([60, 70, 55, 80], seed=3)
    return Preprocessor().fit(rows), synthetic_frame([40, 12, 50], seed=4)


def predicted(fitted, method, members, envelope) -> pd.DataFrame:
    """predict_rows' frame for a model of this kind (constant networks: only the columns
    matter here), with a fitted interval of that method."""
    preprocessor, rows = fitted
    interval = None
    if method == "banded":
        guesses = np.linspace(0, 125, 200)
        interval = fit_banded(guesses, guesses + np.sin(guesses) * 10, 0.9, (25.0, 75.0))
    elif method is not None:
        interval = Interval(0.9, 20.0, 100)
    assert getattr(interval, "method", None) == method
    return predict_rows(ServedModel(preprocessor,
                                    lambda windows: np.full((members, len(windows)), 60.0),
                                    interval, preprocessor.envelope_ if envelope else None),
                        rows)


@pytest.mark.parametrize("kind", KINDS)
def test_the_signature_and_the_frame_are_the_table(fitted, kind):
    """Each kind of model: the signature's columns, types and order, and predict_rows' frame
    (what the lean model, `rul predict` and the torch models return), are the table's."""
    given = served(*KINDS[kind])
    outputs = signature(*KINDS[kind]).outputs
    assert [(c.name, c.type.name) for c in outputs.inputs] == [(c.name, c.type) for c in given]
    frame = predicted(fitted, *KINDS[kind])
    assert list(frame.columns) == [c.name for c in given]
    for column in given:
        assert DTYPE_OF[column.type](frame[column.name]), (column, frame[column.name].dtype)


def test_a_column_moved_or_added_in_the_table_moves_everywhere(fitted, monkeypatch):
    """The table alone orders the columns: reversed, the signature, the frame and the
    description come out reversed; a column added to it appears in the signature and the
    description with its type and meaning, and the predictor refuses to leave it out."""
    kind = KINDS["banded ensemble"]
    names = [c.name for c in served(*kind)]
    monkeypatch.setattr(columns, "COLUMNS", COLUMNS[::-1])
    assert signature(*kind).outputs.input_names() == names[::-1]
    assert list(predicted(fitted, *kind).columns) == names[::-1]
    described = model_description("rul-fd001", signature(*kind).outputs)
    assert described.index("- `flag_reason` (") < described.index("- `unit` (")

    age = Column("engine_age", "long", "cycles the engine has run", "always")
    monkeypatch.setattr(columns, "COLUMNS", (*COLUMNS[:2], age, *COLUMNS[2:]))
    outputs = signature(*kind).outputs
    assert outputs.input_names() == [*names[:2], "engine_age", *names[2:]]
    assert outputs.inputs[2].type.name == "long"
    assert "- `engine_age` (long): cycles the engine has run" in model_description(
        "rul-fd001", outputs)
    with pytest.raises(KeyError, match="engine_age"):
        predicted(fitted, *kind)


def test_the_registered_description_describes_each_column_from_the_table():
    outputs = signature(members=2).outputs
    description = model_description("rul-fd001", outputs)
    for column in COLUMNS:
        assert f"- `{column.name}` ({column.type}): {column.meaning}\n" in description + "\n"


def test_the_table_loads_with_the_standard_library_alone():
    """No site-packages at all (-S): the file runs on its own, as the lean model's code/."""
    code = ("import importlib.util, sys; "
            f"spec = importlib.util.spec_from_file_location('columns', {str(columns.__file__)!r}); "
            "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); "
            "print(','.join(c.name for c in module.served()))")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == ",".join(c.name for c in served())


def test_every_column_says_which_models_give_it_in_the_guides_words(monkeypatch):
    assert len({c.name for c in COLUMNS}) == len(COLUMNS)
    assert {c.given for c in COLUMNS} <= set(GIVEN)
    assert {c.type for c in COLUMNS} <= set(DTYPE_OF)
    monkeypatch.setattr(columns, "COLUMNS", (*COLUMNS, replace(COLUMNS[0], given="someday")))
    with pytest.raises(KeyError, match="someday"):  # a kind of model the table does not know
        served()


def docs_table() -> str:
    lines = ["| column | type | given by | meaning | null when |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| `{c.name}` | {c.type} | {GIVEN[c.given]} | {c.meaning} | {c.null or 'never'} |"
              for c in COLUMNS]
    return "\n".join(lines)


def test_only_the_columns_the_table_says_can_be_null(fitted):
    """A unit beyond the fleet's range: NaN where the table says a column can be null, a
    number or a value everywhere else (the served answer writes NaN as null)."""
    preprocessor, rows = fitted
    rows = rows.copy()
    read = preprocessor.envelope_.columns[0]
    rows.loc[rows.index[rows["unit"] == rows["unit"].iloc[-1]][-1], read] = 1e9
    guesses = np.linspace(0, 125, 200)
    interval = fit_banded(guesses, guesses + np.sin(guesses) * 10, 0.9, (25.0, 75.0))
    sixty = ServedModel(preprocessor, lambda windows: np.full((2, len(windows)), 60.0),
                        interval, preprocessor.envelope_)
    frame = predict_rows(sixty, rows)
    assert frame["flagged"].iloc[-1]
    nulls = {name for name in frame if frame[name].isna().any()}
    assert nulls == {c.name for c in COLUMNS if c.null} == {"p_fail_within"}


def test_the_serve_guide_shows_the_table():
    """docs/guides/serve.md's table of output columns is the table (RUL_WRITE_DOCS=1 rewrites
    it)."""
    text = DOC.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    if os.environ.get("RUL_WRITE_DOCS") == "1":
        DOC.write_text(text[:start] + "\n" + docs_table() + "\n" + text[end:])
    assert text[start:end].strip() == docs_table(), "serve.md's columns: RUL_WRITE_DOCS=1"
