"""A CSV file's delimiter (`data.delimiter`): as given, or found from its first lines.

`auto` takes the candidate (, ; tab |) that splits each of the first lines into the same
number of fields, two or more, the most fields winning (a comma on a tie); a comma when none
does. A table read as one column whose header holds a candidate was split by the wrong one:
`misread` says so, naming the key to set.
"""

from pathlib import Path

CANDIDATES = (",", ";", "\t", "|")  # the comma first: it wins a tie
NAMES = {",": "','", ";": "';'", "\t": "tab", "|": "'|'"}  # as a message says each
SAMPLE = 20  # lines read to decide
SAMPLE_BYTES = 1 << 16


def delimiter_of(path: Path, asked: str = "auto") -> str:
    """The delimiter to read the CSV at `path` with: `asked` (`tab` is a tab), or with
    `auto` the one its first lines agree on."""
    if asked != "auto":
        return "\t" if asked == "tab" else asked
    with open(path, encoding="utf-8", errors="replace", newline="") as handle:
        text = handle.read(SAMPLE_BYTES)
    lines = text.splitlines()
    if len(text) == SAMPLE_BYTES and len(lines) > 1:
        lines = lines[:-1]  # the last line read may be cut short
    lines = [line for line in lines[:SAMPLE] if line.strip()]
    best, most = ",", 1
    for candidate in CANDIDATES:
        counts = {line.count(candidate) for line in lines}
        if len(counts) == 1 and (fields := counts.pop() + 1) > most:
            best, most = candidate, fields
    return best


def misread(columns: list[str], used: str) -> str | None:
    """What is wrong when a CSV read with `used` gave one column whose name holds another
    candidate (the file's real delimiter); None when nothing says so."""
    if len(columns) != 1:
        return None
    header = str(columns[0])
    found = [c for c in CANDIDATES if c != used and c in header]
    if not found:
        return None
    setting = "tab" if found[0] == "\t" else found[0]
    shown = header if len(header) <= 40 else header[:37] + "..."
    return (f"read with the delimiter {NAMES[used]}, its header is one column {shown!r}, "
            f"which holds {NAMES[found[0]]}: set data.delimiter: {setting!r}")


def named(delimiter: str) -> str:
    """The delimiter as a message says it (`tab` for a tab)."""
    return NAMES.get(delimiter, repr(delimiter))
