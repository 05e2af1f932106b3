"""FD001 as an operator would keep it: one Parquet table of the fleet's histories under NASA's
own sensor names, no separate test set, and a CSV of the engines in service now (the guide
"Train on your own fleet" trains, tunes, registers and serves on them).

    .venv/bin/python tools/fleet_example.py          # writes fleet/engines.parquet, fleet/now.csv

engines.parquet: the 100 engines of train_FD001.txt, run to failure: engine_id,
flight_cycle, altitude, mach, tra and the 21 sensors as the C-MAPSS paper names them (T2,
T24, T30, ..., W32), columns in an operator's order, with a column the model does not need
(`fleet`). now.csv: the 100 histories of test_FD001.txt, cut off before failure: what
`rul predict` and the served model answer for.
"""

import sys
from pathlib import Path

from rul.data import DataError, load_subset
from rul.data.schema import SENSOR_COLUMNS

# The sensors as Saxena et al. (2008), the C-MAPSS paper, name them, in s_1..s_21's order.
NASA_NAMES = ["T2", "T24", "T30", "T50", "P2", "P15", "P30", "Nf", "Nc", "epr", "Ps30", "phi",
              "NRf", "NRc", "BPR", "farB", "htBleed", "Nf_dmd", "PCNfR_dmd", "W31", "W32"]
RENAMED = {"unit": "engine_id", "cycle": "flight_cycle", "setting_1": "altitude",
           "setting_2": "mach", "setting_3": "tra",
           **dict(zip(SENSOR_COLUMNS, NASA_NAMES, strict=True))}


def main(folder: str = "fleet") -> None:
    out = Path(folder)
    out.mkdir(exist_ok=True)
    try:
        fd001 = load_subset("FD001")  # CMAPSS_DIR, the cache, or a verified download
    except DataError as error:
        sys.exit(f"Error: {error}")
    engines = fd001.train.rename(columns=RENAMED).assign(fleet="FD001")
    first = ["engine_id", "flight_cycle", "fleet", "altitude", "mach", "tra"]
    engines[first + sorted(NASA_NAMES)].to_parquet(out / "engines.parquet", index=False)
    fd001.test.rename(columns=RENAMED).to_csv(out / "now.csv", index=False)
    print(f"wrote {out / 'engines.parquet'} ({len(engines)} rows, "
          f"{engines['engine_id'].nunique()} engines) and {out / 'now.csv'}")


if __name__ == "__main__":
    main(*sys.argv[1:])
