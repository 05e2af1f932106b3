"""The fleet page (rul.serving.fleet_page): the engines in service ranked by their probability
of failing within the horizon, a chart of each one's RUL and interval, its flags, one HTML file
that opens offline. The page itself is checked here; the end-to-end test builds it from a model
folder without torch and opens it in headless Chromium (playwright drives Debian's)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rul.serving.fleet_page import page, ranked

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = os.environ.get("RUL_SCREENSHOTS")  # a folder: save the fleet guide's picture


def predictions() -> pd.DataFrame:
    return pd.DataFrame({
        "tail": [101, 102, 103, 104],
        "rul": [80.0, 12.0, 40.0, 15.0],
        "rul_lower": [60.0, 4.0, np.nan, 8.0],
        "rul_upper": [100.0, 25.0, np.nan, 30.0],
        "p_fail_within": [0.01, 0.90, np.nan, 0.90],
        "padded": [False, False, True, False],
        "flagged": [False, True, False, False],
        "flag_reason": [None, "T24 <script>alert(1)</script> 9 sd beyond", None, None]})


def test_engines_are_ranked_by_their_chance_of_failing_then_their_rul():
    assert ranked(predictions())["tail"].tolist() == [102, 104, 101, 103]


def test_the_page_holds_every_engine_ranked_with_its_flags_escaped_and_opens_offline():
    text = page(predictions(), horizon=20, model="models:/rul-fleet@champion",
                source="in_service.csv")
    table = text[text.index("<tbody>"):text.index("</tbody>")]
    engines = [line.split("class='engine'>")[1].split("<")[0] for line in table.splitlines()
               if "class='engine'" in line]
    assert engines == ["102", "104", "101", "103"]
    assert "<td>90%</td>" in table and "12</td><td>4&ndash;25</td>" in table
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in table and "<script>alert" not in text
    assert "history shorter than the window (padded)" in table
    assert "Fleet: 4 engines in service" in text and "1 flagged" in text
    assert "next 20 cycles" in text and "models:/rul-fleet@champion" in text
    assert "<script src=" not in text  # plotly's script inline
    assert len(text) > 1_000_000  # ... which is most of the file


@pytest.mark.slow
def test_the_page_is_made_without_torch_and_a_browser_shows_every_engine(tmp_path, fd001):
    from test_inference import tiny_model_folder
    from test_intervals import banded_interval

    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} not found: apt-get install chromium (.ci/run does)") \
            if os.environ.get("CI") == "true" else pytest.skip(f"{CHROMIUM} not found")
    from playwright.sync_api import sync_playwright

    folder = tiny_model_folder(fd001, tmp_path, interval=banded_interval())
    fd001.test.to_csv(tmp_path / "in_service.csv", index=False)
    output = tmp_path / "fleet.html"
    no_torch = ("import sys, runpy; sys.modules['torch'] = None; "  # importing it fails
                "sys.argv = ['fleet_page', *sys.argv[1:]]; "
                "runpy.run_module('rul.serving.fleet_page', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", no_torch, folder, "--input",
                           str(tmp_path / "in_service.csv"), "--output", str(output)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"wrote {output}: 100 engines"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM),
                                             args=["--headless", "--no-sandbox",
                                                   "--disable-gpu"])
        try:
            shown = browser.new_page(viewport={"width": 1200, "height": 800})
            shown.route("**/*", lambda route: route.abort()
                        if not route.request.url.startswith("file:") else route.continue_())
            shown.goto(output.as_uri())
            shown.locator("#fleet-chart .main-svg").first.wait_for(timeout=30_000)
            listed = shown.locator("#fleet-table td.engine").all_inner_texts()
            assert sorted(map(int, listed)) == list(range(1, 101))
            points = shown.locator("#fleet-chart .scatterlayer .point").count()
            assert points == 100
            if SCREENSHOTS:
                shown.screenshot(path=str(Path(SCREENSHOTS) / "fleet_page.png"))
        finally:
            browser.close()
