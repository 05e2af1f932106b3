"""Names and shapes of the C-MAPSS files."""

SUBSETS = ("FD001", "FD002", "FD003", "FD004")

SETTING_COLUMNS = [f"setting_{i}" for i in range(1, 4)]
SENSOR_COLUMNS = [f"s_{i}" for i in range(1, 22)]
COLUMNS = ["unit", "cycle", *SETTING_COLUMNS, *SENSOR_COLUMNS]

# The 14 sensors that carry degradation signal in FD001/FD003 (the others are constant or
# nearly so); the common choice in the literature since Li et al. 2018.
INFORMATIVE_SENSORS = [f"s_{i}" for i in (2, 3, 4, 7, 8, 9, 11, 12, 13, 14, 15, 17, 20, 21)]

# Number of operating conditions per subset (readme.txt of the archive).
OPERATING_CONDITIONS = {"FD001": 1, "FD002": 6, "FD003": 1, "FD004": 6}


def check_subset(name: str) -> str:
    """Return the canonical subset name ('fd001' -> 'FD001') or raise a clear error."""
    canonical = str(name).strip().upper()
    if canonical not in SUBSETS:
        raise ValueError(f"unknown C-MAPSS subset {name!r}: expected one of {', '.join(SUBSETS)}")
    return canonical


def file_names(subset: str) -> dict[str, str]:
    """The three files that make up one subset, by role."""
    subset = check_subset(subset)
    return {"train": f"train_{subset}.txt", "test": f"test_{subset}.txt",
            "rul": f"RUL_{subset}.txt"}
