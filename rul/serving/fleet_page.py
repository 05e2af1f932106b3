"""The fleet page: the engines in service ranked by their probability of failing within the
horizon, each engine's predicted RUL with its interval in one chart, and its flags, written as
one self-contained HTML file a maintenance planner opens in any browser, offline (plotly draws
the chart; its script is inline).

It reads a model folder as data (rul.serving.served: no torch, no MLflow, the folder's code
never run), so it runs where the lean server runs, with plotly installed there:

    PYTHONPATH=model/code serve-env/bin/python -m rul.serving.fleet_page model \\
        --input in_service.csv --output fleet.html

and from the project as `rul fleet-page` (a registered model, as `rul predict` reads it).
"""

import argparse
import html
import math
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from rul.files import write_whole
from rul.serving.predictor import PARAMS

ROW_PX = 22  # the chart's height per engine


def ranked(predictions: pd.DataFrame) -> pd.DataFrame:
    """The engines, most likely to fail within the horizon first (then the lowest RUL; a model
    without an interval has no probability: by RUL alone)."""
    order = predictions.assign(_p=predictions["p_fail_within"].fillna(-1.0))
    order = order.sort_values(["_p", "rul"], ascending=[False, True], kind="stable")
    return order.drop(columns="_p").reset_index(drop=True)


def _flags(row) -> str:
    said = []
    if bool(row.get("flagged", False)):
        said.append(str(row.get("flag_reason") or "outside the training fleet"))
    if bool(row.get("padded", False)):
        said.append("history shorter than the window (padded)")
    return "; ".join(said)


def _cycles(value) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else f"{value:.0f}"


def _chart(engines: pd.DataFrame, unit: str, horizon: float) -> str:
    """The predicted RUL of every engine with its interval, ranked as the table, as an HTML
    fragment with plotly's script inline."""
    import plotly.graph_objects as go

    labels = [f"{unit} {u}" for u in engines[unit]]
    has_interval = engines["rul_lower"].notna().any()
    error = dict(type="data", symmetric=False, array=(engines["rul_upper"] - engines["rul"]),
                 arrayminus=(engines["rul"] - engines["rul_lower"]), color="#888",
                 thickness=1.5) if has_interval else None
    flagged = engines["flagged"].astype(bool) if "flagged" in engines else None
    figure = go.Figure(go.Scatter(
        x=engines["rul"], y=labels, mode="markers", error_x=error,
        marker=dict(size=9, color=engines["p_fail_within"].fillna(0.0),
                    colorscale="YlOrRd", cmin=0.0, cmax=1.0,
                    colorbar=dict(title=f"P(fail within {horizon:g})", len=300,
                                  lenmode="pixels", y=1.0, yanchor="top"),
                    symbol=["x" if f else "circle" for f in flagged] if flagged is not None
                    else "circle", line=dict(width=0.5, color="#333")),
        hovertemplate="%{y}: RUL %{x:.0f} cycles<extra></extra>"))
    figure.add_vline(x=horizon, line_dash="dot", line_color="#c00",
                     annotation_text=f"horizon {horizon:g}", annotation_position="top right")
    figure.update_layout(
        height=140 + ROW_PX * len(engines), margin=dict(l=110, r=20, t=90, b=20),
        xaxis=dict(side="top", title="predicted RUL (cycles)" + (
            ", with its interval" if has_interval else "")),
        yaxis=dict(type="category", range=[len(engines) - 0.5, -0.5]),  # the first on top
        plot_bgcolor="white")
    figure.update_xaxes(gridcolor="#eee", rangemode="tozero")
    return figure.to_html(full_html=False, include_plotlyjs=True, div_id="fleet-chart",
                          config={"displaylogo": False})


def page(predictions: pd.DataFrame, horizon: float, model: str, source: str) -> str:
    """The fleet page of `predictions` (rul predict's frame: its first column the engine's
    id) as one HTML document."""
    unit = predictions.columns[0]
    engines = ranked(predictions)
    rows = []
    for rank, row in enumerate(engines.to_dict(orient="records"), start=1):
        interval = (f"{_cycles(row.get('rul_lower'))}&ndash;{_cycles(row.get('rul_upper'))}"
                    if _cycles(row.get("rul_lower")) else "")
        p = row.get("p_fail_within")
        chance = "" if p is None or math.isnan(p) else f"{p:.0%}"
        rows.append(f"<tr><td>{rank}</td><td class='engine'>{html.escape(str(row[unit]))}</td>"
                    f"<td>{_cycles(row['rul'])}</td><td>{interval}</td><td>{chance}</td>"
                    f"<td>{html.escape(_flags(row))}</td></tr>")
    flagged = int(engines["flagged"].astype(bool).sum()) if "flagged" in engines else 0
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Fleet: {len(engines)} engines in service</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; }}
table {{ border-collapse: collapse; margin-top: 1rem; }}
th, td {{ padding: 0.25rem 0.75rem; border-bottom: 1px solid #ddd; text-align: right; }}
th:last-child, td:last-child {{ text-align: left; }}
.meta {{ color: #555; }}
</style></head><body>
<h1>Fleet: {len(engines)} engines in service</h1>
<p class="meta">Ranked by the probability of failing within the next {horizon:g} cycles.
{flagged} flagged (outside the training fleet or a short history: read their figures with care).
Model {html.escape(model)}; rows from {html.escape(source)}; made {made}.</p>
{_chart(engines, unit, horizon)}
<table id="fleet-table">
<thead><tr><th>rank</th><th>{html.escape(str(unit))}</th><th>RUL (cycles)</th><th>interval</th>
<th>P(fail within {horizon:g})</th><th>flags</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>
</body></html>
"""


def write_page(predictions: pd.DataFrame, output: str | Path, horizon: float, model: str,
               source: str) -> Path:
    """The page, written whole or not at all."""
    output = Path(output)
    write_whole(output, page(predictions, horizon, model, source))
    return output


def main(argv: list[str] | None = None) -> int:
    from rul.data.errors import DataError
    from rul.data.reader import read_input
    from rul.serving import served

    parser = argparse.ArgumentParser(
        prog="python -m rul.serving.fleet_page",
        description="The engines in service as one self-contained HTML page.")
    parser.add_argument("model", help="a model folder (mlflow.artifacts.download_artifacts)")
    parser.add_argument("--input", required=True, help="their rows: CSV, Parquet or NASA text")
    parser.add_argument("--output", required=True, help="the HTML file to write")
    parser.add_argument("--horizon", type=float, default=PARAMS["horizon"],
                        help=f"cycles ahead (default {PARAMS['horizon']:g})")
    args = parser.parse_args(argv)
    try:
        if not Path(args.output).parent.is_dir():
            raise ValueError(f"{args.output}: folder {Path(args.output).parent} does not exist")
        model = served.load(args.model)
        predictions = model.predict(read_input(args.input), {"horizon": args.horizon})
        written = write_page(predictions, args.output, args.horizon, args.model, args.input)
    except (DataError, ValueError, OSError) as error:
        print(f"Error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {written}: {len(predictions)} engines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
