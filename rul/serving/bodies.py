"""A request's body as rows and parameters, in the formats MLflow's scoring server documents:
JSON (`dataframe_split` or `dataframe_records`, and `params`), CSV as DataFrame.to_csv() writes
it, and Parquet as DataFrame.to_parquet() writes it (with pyarrow installed; a lean
environment without it refuses Parquet saying so). The frames are those MLflow's parser builds,
built in less memory (docs: Performance). Every refusal is a BodyError: one line, its HTTP
status, never a byte of the body. Numpy and pandas only (pyarrow where installed): the lean
served model's code/ carries it.
"""

import importlib.util
import io
import json

import pandas as pd

from rul.data.errors import quoted
from rul.data.validation import VALUE_COLUMNS

JSON, CSV, PARQUET = "json", "csv", "parquet"
MEDIA = {"application/json": JSON, "text/csv": CSV, "application/vnd.apache.parquet": PARQUET}
ACCEPTED = "application/json, text/csv or application/vnd.apache.parquet"
DATA_KEYS = "dataframe_split or dataframe_records"
ROWS_PER_PART = 50_000  # JSON rows made into a frame at once
GZIP_MAGIC = b"\x1f\x8b"  # how a gzip stream starts (RFC 1952)
DECODED_BYTES = 8  # what a Parquet value takes decoded (a float64 or int64 column)


class BodyError(ValueError):
    """A body or its headers refused: `line` (one line, no request content) and `status`."""

    def __init__(self, line: str, status: int = 400):
        super().__init__(line)
        self.line, self.status = line, status


def media_of(content_type: bytes | str | None) -> str:
    """JSON, CSV or PARQUET from a Content-Type header; BodyError (400 when missing, 415 for
    any other type or a charset other than UTF-8) that never repeats the header."""
    if content_type is None or not content_type.strip():
        raise BodyError(f"headers: Content-Type is missing; send {ACCEPTED}")
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    media, *parameters = (part.strip() for part in content_type.split(";"))
    kind = MEDIA.get(media.lower())
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() != "charset" or value.strip().strip('"').lower() != "utf-8":
            kind = None
    if kind is None:
        raise BodyError(f"headers: Content-Type must be {ACCEPTED} (charset utf-8, if any)",
                        415)
    return kind


def plain(content_encoding: bytes | str | None) -> None:
    """BodyError (415) for a Content-Encoding other than identity: the server reads bodies as
    they are sent, never decompressed (a gzip body would be read as JSON and not be JSON)."""
    if isinstance(content_encoding, bytes):
        content_encoding = content_encoding.decode("latin-1")
    if (content_encoding or "").strip().lower() not in ("", "identity"):
        raise BodyError("headers: Content-Encoding is not accepted; send the body "
                        "uncompressed", 415)


def parquet_readable() -> bool:
    return importlib.util.find_spec("pyarrow") is not None


def footer_size(body: bytes) -> int:
    """The bytes of a Parquet body's footer (its metadata), from its last 8 bytes alone;
    BodyError if it has none."""
    if len(body) < 12 or body[-4:] != b"PAR1" or body[:4] != b"PAR1":
        raise BodyError(_NOT_PARQUET)
    size = int.from_bytes(body[-8:-4], "little")
    if size > len(body) - 12:
        raise BodyError(_NOT_PARQUET)
    return size


def decoded_size(body: bytes) -> int:
    """The bytes a Parquet body's rows take decoded (rows x columns x 8, at least its string
    columns' uncompressed size), read from its footer alone; BodyError if it has none."""
    _need_pyarrow()
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(pa.BufferReader(body)).metadata
        size = 0
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            size += sum(max(group.num_rows * DECODED_BYTES,
                            group.column(c).total_uncompressed_size)
                        for c in range(group.num_columns))
    except (pa.ArrowException, OSError, ValueError):
        raise BodyError(_NOT_PARQUET) from None
    return size


def read_body(body: bytes, media: str, columns: list[str] | None = None,
              optional: tuple = ()
              ) -> tuple[pd.DataFrame, dict | None]:
    """The rows of a body and its request parameters (JSON only; None for the defaults).
    `columns`: those the model reads (`optional`: those of them it may go without); a Parquet
    body's others are not read."""
    if media != PARQUET and body[:2] == GZIP_MAGIC:
        raise BodyError(f"body: gzip-compressed; send the {media.upper()} uncompressed (this "
                        "server decompresses nothing)")
    if media == JSON:
        return _json(body)
    if media == CSV:
        return _csv(body), None
    return _parquet(body, columns, optional), None


def _json(body: bytes) -> tuple[pd.DataFrame, dict | None]:
    try:
        parsed = json.loads(body)
    except RecursionError:
        raise BodyError("body: JSON nested too deeply; send a JSON object with "
                        f"{DATA_KEYS}, its rows as lists of numbers") from None
    except (ValueError, UnicodeDecodeError):  # JSONDecodeError is a ValueError
        raise BodyError(f"body: not valid JSON; send a JSON object with {DATA_KEYS} (and "
                        "params), or a CSV") from None
    if not isinstance(parsed, dict):
        raise BodyError(f"body: a JSON object needs exactly one of {DATA_KEYS} (and may "
                        "have params)")
    params = parsed.pop("params", None)
    if params is not None and not isinstance(params, dict):
        raise BodyError("params: must be a JSON object (short_history, strict, horizon)")
    found = [key for key in ("dataframe_split", "dataframe_records", "instances", "inputs")
             if key in parsed]
    if found not in (["dataframe_split"], ["dataframe_records"]):
        raise BodyError(f"body: a JSON object needs exactly one of {DATA_KEYS} (and may "
                        "have params)")
    if found == ["dataframe_split"]:
        split = parsed.pop("dataframe_split")
        if not isinstance(split, dict) or not isinstance(split.get("data"), list) or (
                set(split) - {"columns", "data", "index"}):
            raise BodyError("body: dataframe_split must be an object with data, a list of rows, "
                            "and columns")
        columns = split.get("columns")
        if columns is not None and not isinstance(columns, list):
            raise BodyError("body: dataframe_split's columns must be a list of names")
        return _frame(split["data"], columns, "dataframe_split"), params
    records = parsed.pop("dataframe_records")
    if not isinstance(records, list):
        raise BodyError("body: dataframe_records must be a list of records")
    return _frame(records, None, "dataframe_records"), params


def _frame(rows: list, columns: list | None, key: str) -> pd.DataFrame:
    """pd.DataFrame(rows, columns=columns), built ROWS_PER_PART rows at a time, each part's
    lists freed once it is a frame (never one array of objects as large as the frame)."""
    parts = []
    try:
        while rows or not parts:
            part = rows[:ROWS_PER_PART]
            del rows[:ROWS_PER_PART]
            parts.append(pd.DataFrame(part, columns=columns))
            del part
        return parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    except (ValueError, TypeError, AssertionError):
        raise BodyError(f"body: {key} is not a table: each row must hold one value per "
                        "column") from None


def _csv(body: bytes) -> pd.DataFrame:
    """The CSV as pandas reads it, its value columns as float64 at once (no second copy for
    validation); a value that is no number reads it again as pandas would, for the model to name."""
    try:
        try:
            return pd.read_csv(io.BytesIO(body), dtype=dict.fromkeys(VALUE_COLUMNS, "float64"))
        except ValueError:
            return pd.read_csv(io.BytesIO(body))
    except UnicodeDecodeError:
        raise BodyError("body: a CSV must be UTF-8 text") from None
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
        raise BodyError("body: not a CSV pandas can read; send DataFrame.to_csv()'s output, "
                        "with its header") from None


_NOT_PARQUET = "body: not a Parquet file pandas can read; send DataFrame.to_parquet()'s output"


def _need_pyarrow() -> None:
    if not parquet_readable():
        raise BodyError("body: Parquet needs pyarrow, which this server's environment lacks; "
                        "send JSON or CSV", 415)


def _parquet(body: bytes, columns: list[str] | None, optional: tuple = ()) -> pd.DataFrame:
    """The `columns` of a Parquet body (None: every one) that it holds, and no other; a column
    of lists or nested values is refused before it is decoded. Where one of `columns` not
    `optional` is missing, a frame without rows under the file's names, for validation to
    say which."""
    _need_pyarrow()
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(pa.BufferReader(body))
        schema = file.schema_arrow
        if columns is not None and not {c for c in columns if c not in optional} <= set(
                schema.names):
            return pd.DataFrame(columns=schema.names)
        wanted = schema.names if columns is None else [c for c in columns if c in schema.names]
        for name in wanted:
            if pa.types.is_nested(schema.field(name).type):
                raise BodyError(f"body: column {quoted(name)} holds lists or nested values; "
                                "a cell is one number")
        return file.read(columns=wanted).to_pandas()
    except BodyError:
        raise
    except (pa.ArrowException, OSError, ValueError, KeyError):
        raise BodyError(_NOT_PARQUET) from None


