"""The prediction itself, from raw rows to one row per unit (no MLflow here, no torch at import).

`predict_rows` is the one path from rows to the output frame: the lean runtime
(rul.serving.runtime: ONNX files through onnxruntime) and `predict_frame` (torch networks)
both call it with a function that maps windows to each member's predictions. An ensemble's
prediction is its members' mean (`average_members`), their spread the column `rul_std`; a
"banded" interval adds p_fail_within, read from the same calibrated distribution as the bounds
(docs: Predict and serve).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rul.data.errors import DataError
from rul.data.layout import CMAPSS, Layout
from rul.data.validation import validate_rows
from rul.evaluation.averaging import average_members
from rul.evaluation.conformal import DEFAULT_HORIZON, Interval
from rul.preprocessing.windows import unit_lengths
from rul.serving import deadline
from rul.serving.columns import served
from rul.serving.spec import InferenceSpec  # noqa: F401 (its home before spec.py)

SHORT_HISTORY = ("pad", "reject")


@dataclass(frozen=True)
class Param:
    """A request parameter: its name, MLflow's type for it (the pyfunc signature's), its
    default and what it does (the registered model's description says it)."""

    name: str
    type: str
    default: object
    meaning: str


# The request parameters: what check_params accepts, the signature declares
# (rul.serving.signature) and the registered model's description lists (rul.tracking.registry).
REQUEST_PARAMS = (
    Param("short_history", "string", "pad",
          "`pad` front-pads a unit shorter than the window (flagged `padded`); `reject` "
          "refuses the request when a unit is that short"),
    Param("strict", "boolean", False,
          "`true` refuses the request when a unit lies outside the training fleet (otherwise "
          "it is flagged, with its reason)"),
    Param("horizon", "double", DEFAULT_HORIZON,
          "cycles ahead for `p_fail_within`, the probability that the engine fails within "
          "them; between 0 and the model's RUL cap"),
)
PARAMS = {param.name: param.default for param in REQUEST_PARAMS}  # the defaults
MAX_UNITS_NAMED = 5  # a refusal names this many units, then counts the rest
# ... and no more than fit in this many characters, so that the served 400's one line
# (rul.serving.request_errors.MAX_LINE, 180, with the input's name before it) keeps its count
REFUSAL_CHARS = 150
ROWS_AT_ONCE = 65_536  # rows made into features at once (whole units: more for a longer one)
UNITS_AT_ONCE = 4096  # units made into windows and predicted at once
NAME_CHARS = 40  # a name a request gave (a parameter's) is quoted escaped, cut to this many


def check_params(params: dict | None) -> dict:
    """The request's parameters with defaults filled in; ValueError for an unknown name or a
    value of the wrong kind."""
    params = dict(params or {})
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:  # a name is quoted (escaped, cut); a value never is: it is the request's
        raise ValueError(f"unknown parameter {', '.join(_short(n, NAME_CHARS) for n in unknown)}"
                         f"; allowed: {', '.join(PARAMS)}")
    values = {**PARAMS, **{k: v for k, v in params.items() if v is not None}}
    if values["short_history"] not in SHORT_HISTORY:
        raise ValueError(f"short_history must be one of {', '.join(SHORT_HISTORY)}")
    if not isinstance(values["strict"], (bool, np.bool_)):
        raise ValueError("strict must be true or false")
    return values  # horizon: check_horizon, against the model's RUL cap


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def check_horizon(horizon, rul_cap: float) -> float:
    """`horizon` as a number of cycles, 0 < horizon < rul_cap (the RUL the model knows is
    capped: it cannot tell a failure past the cap from one at it); ValueError otherwise."""
    value = None if isinstance(horizon, (bool, np.bool_, str)) or not _is_number(horizon) \
        else float(horizon)
    if value is None or not 0 < value < rul_cap:
        raise ValueError(f"horizon must be a number of cycles between 0 and the model's RUL cap "
                         f"({rul_cap:g}), exclusive")
    return value


def _short(value, limit: int = 30) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def member_predictions(networks: Sequence, windows) -> np.ndarray:
    """RUL of each window by each torch network, on the network's own device (a model just
    trained on a GPU is still there): shape (members, windows), float64."""
    import torch

    x = torch.as_tensor(windows, dtype=torch.float32)
    with torch.inference_mode():
        return np.stack([net(x.to(next(net.parameters()).device)).float().cpu().numpy()
                         .astype(np.float64) for net in networks])


def refusal(units, reasons, flagged, unit: str = "unit") -> str:
    """The strict refusal: the flagged units with their reasons (the first few, then a
    count); `unit`: the data set's name of its unit column."""
    listed = [f"{unit} {u} ({r})" for u, r, f in zip(units, reasons, flagged) if f]
    head = "outside the training fleet (strict): "
    for named in range(min(len(listed), MAX_UNITS_NAMED), 0, -1):
        more = len(listed) - named
        text = head + "; ".join(listed[:named]) + (f"; and {more} more" if more else "")
        if len(text) <= REFUSAL_CHARS:
            return text
    more = f"; and {len(listed) - 1} more" if len(listed) > 1 else ""
    room = REFUSAL_CHARS - len(head) - len(more) - 4  # the first one's reason, cut: "...)"
    return head + listed[0][:room] + "...)" + more


def member_rul_of(model: "ServedModel", rows: pd.DataFrame, lengths) -> tuple:
    """(units, each member's RUL per unit: (members, units)) of `rows`: the windows made and
    predicted a block of whole units at a time, at most about ROWS_AT_ONCE rows or
    UNITS_AT_ONCE units (a unit's window holds `window` cycles, padded: 100,000 one-row units
    once made 336 MB of windows at once), the same numbers, the deadline checked between."""
    bounds, rows_in, units_in = [0], 0, 0
    for end, length in zip(np.cumsum(lengths), lengths):
        rows_in, units_in = rows_in + int(length), units_in + 1
        if rows_in >= ROWS_AT_ONCE or units_in >= UNITS_AT_ONCE:
            bounds.append(int(end))
            rows_in, units_in = 0, 0
    if bounds[-1] != len(rows):
        bounds.append(len(rows))
    units, members = [], []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        deadline.check()
        block = rows if len(bounds) == 2 else rows.iloc[start:stop]
        block_units, windows = model.preprocessing.last_windows(block)
        deadline.check()
        members.append(np.asarray(model.predict_members(windows), dtype=np.float64))
        units.append(block_units)
        del windows
    if len(units) == 1:
        return units[0], members[0]
    return np.concatenate(units), np.concatenate(members, axis=1)


@dataclass(frozen=True)
class ServedModel:
    """What predicting rows needs of a model: `preprocessing` (fitted), `predict_members(windows)`
    ((members, windows)), the `interval`, the `envelope` and the `layout` of the data set."""

    preprocessing: object
    predict_members: Callable[[np.ndarray], np.ndarray]
    interval: Interval | None = None
    envelope: object = None  # rul.preprocessing.envelope.Envelope
    layout: Layout = CMAPSS

    @classmethod
    def of_torch(cls, preprocessor, model, interval: Interval | None = None,
                 envelope=None) -> "ServedModel":
        """A model of torch networks: `model` is a network, or a list of networks (an
        ensemble: `rul` is their mean, `rul_std` their spread per unit)."""
        networks = list(model) if isinstance(model, (list, tuple)) else [model]
        return cls(preprocessor, lambda windows: member_predictions(networks, windows),
                   interval, envelope)


def predict_rows(model: ServedModel, rows: pd.DataFrame, source="input",
                 params: dict | None = None) -> pd.DataFrame:
    """RUL at the last cycle of each unit in `rows`, one row per unit in the order they come
    in, with the columns (rul.serving.columns) `model` gives: bounds with an interval (clipped
    to [0, rul_cap] like rul), p_fail_within with a "banded" one, rul_std for several
    members, the flags with an envelope; the first is the data set's unit column.

    `rows`: raw rows with the layout's columns under the data set's names, checked by
    validate_rows; give each unit's whole history (sensors are smoothed causally). `params`
    (check_params fills the defaults): short_history "pad" front-pads a unit shorter than the
    window with its first row (flagged `padded`), "reject" refuses it; `strict` refuses a unit
    outside the envelope, else one beyond the fleet's range gets [0, rul_cap] and
    p_fail_within NaN; `horizon` (0 < horizon < rul_cap) is p_fail_within's.
    """
    params = check_params(params)
    horizon = check_horizon(params["horizon"], model.preprocessing.rul_cap)
    rows = validate_rows(rows, source, model.layout, unread(model.envelope))
    deadline.check()
    ids, lengths = unit_lengths(rows["unit"].to_numpy())
    padded = lengths < model.preprocessing.window
    if params["short_history"] == "reject" and padded.any():
        raise DataError(source, _too_short(model, ids[padded], lengths[padded]))
    flags = _flags(model, rows, ids, params["strict"], source)
    deadline.check()
    units, member_rul = member_rul_of(model, rows, lengths)
    rul, spread = average_members(member_rul)
    values = {"unit": units.astype(np.int64), "rul": rul, "padded": padded, "rul_std": spread}
    given = served(model.interval.method if model.interval is not None else None,
                   len(member_rul), model.envelope is not None)
    values.update(_uncertainty(model, rul, flags, horizon,
                               {column.name for column in given}))
    output = [model.layout.unit if c.name == "unit" else c.name for c in given]
    return pd.DataFrame({name: values[column.name]
                         for name, column in zip(output, given, strict=True)})


def unread(envelope) -> tuple:
    """The sensors a model of `envelope` does not read, which a request may leave out (given,
    the envelope checks them for a broken feed); none for a model without an envelope."""
    return tuple(envelope.unread) if envelope is not None else ()


def _too_short(model: ServedModel, ids, lengths) -> str:
    listed = ", ".join(f"{model.layout.unit} {u} has {n} rows" for u, n in zip(ids, lengths))
    return (f"history shorter than the window ({model.preprocessing.window} cycles): "
            f"{listed}")


def _flags(model: ServedModel, rows: pd.DataFrame, ids, strict: bool, source):
    """(flagged, reasons, beyond) of each unit, from the model's envelope (None without one);
    `strict` refuses the rows when a unit is flagged."""
    if model.envelope is None:
        return None
    preprocessing, layout = model.preprocessing, model.layout
    labels = preprocessing.conditions(rows[list(layout.settings)].to_numpy())
    flagged, reasons, beyond = model.envelope.check(
        rows, labels, preprocessing.window, whole_history=preprocessing.smoothing_alpha < 1)
    if strict and flagged.any():
        raise DataError(source, refusal(ids, reasons, flagged, layout.unit))
    return flagged, reasons, beyond


def _uncertainty(model: ServedModel, rul: np.ndarray, flags, horizon: float,
                 names: set) -> dict:
    """The bounds, p_fail_within and flags `names` asks for; a unit with a value or the settings
    beyond the fleet's range (outside the calibration) gets [0, rul_cap] and p_fail_within NaN."""
    values = {}
    unknown = flags[2] if flags is not None else np.zeros(len(rul), bool)
    cap = float(model.preprocessing.rul_cap)
    if "rul_lower" in names:
        lower, upper = model.interval.bounds(rul, high=cap)
        values["rul_lower"] = np.where(unknown, 0.0, lower)
        values["rul_upper"] = np.where(unknown, cap, upper)
    if "p_fail_within" in names:
        values["p_fail_within"] = np.where(
            unknown, np.nan, model.interval.failure_probability(rul, horizon))
    if flags is not None:
        values["flagged"], values["flag_reason"] = flags[0], flags[1]
    return values


def predict_frame(preprocessor, model, rows: pd.DataFrame, params: dict | None = None,
                  interval: Interval | None = None, envelope=None) -> pd.DataFrame:
    """predict_rows with torch networks: `model` is a network, or a list of networks (an
    ensemble: `rul` is their mean, `rul_std` their spread per unit)."""
    return predict_rows(ServedModel.of_torch(preprocessor, model, interval, envelope), rows,
                        params=params)
