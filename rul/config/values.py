"""The value types of the config keys and the strict base model of every config.

A field's description is what an error says its value must be.
"""

import os
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

_CLEAN_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _yaml_number(value: Any) -> Any:
    """YAML 1.1 reads 3e-4 (no dot) as a string: a clean numeric string counts as a number."""
    if isinstance(value, str) and _CLEAN_NUMBER.fullmatch(value.strip()):
        return float(value)
    return value


def _number(description: str, **bounds) -> Any:
    return Annotated[float, BeforeValidator(_yaml_number),
                     Field(allow_inf_nan=False, description=description, **bounds)]


def _one_of(*choices: str) -> Any:
    return Annotated[Literal[choices], Field(description="one of " + ", ".join(choices))]


PositiveInt = Annotated[int, Field(ge=1, description="a positive integer")]
NonNegativeInt = Annotated[int, Field(ge=0, description="a non-negative integer")]
Flag = Annotated[bool, Field(description="true or false")]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_BYTES = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)")


def parse_bytes(value: Any) -> Any:
    """'6GiB', '512MiB', '1.5GB' or a plain number of bytes -> int bytes (> 0)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    text = str(value).strip().lower()
    match = _BYTES.fullmatch(text)
    if isinstance(value, bool) or not match or match.group(2) not in _UNITS:
        raise ValueError("must be a memory size such as 6GiB, 512MiB or 2GB (or null)")
    size = int(float(match.group(1)) * _UNITS[match.group(2)])
    if size <= 0:
        raise ValueError("must be a memory size greater than 0 (such as 512MiB)")
    return size


MemorySize = Annotated[int | None, BeforeValidator(parse_bytes), Field(
    description="a memory size such as 6GiB or 512MiB, or null")]
MicroBatch = Annotated[PositiveInt | Literal["auto"], Field(
    description="a positive integer or auto")]


def _path_text(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


Text = Annotated[str, BeforeValidator(_path_text), Field(description="a string")]
OptionalText = Annotated[str | None, BeforeValidator(_path_text),
                         Field(description="a string or null")]


def rule_error(where: str, message: str) -> PydanticCustomError:
    """A cross-field rule's error; `where` is usually `key=value`."""
    return PydanticCustomError("config_rule", "{where}: {message}",
                               {"where": where, "message": message})


class _Strict(BaseModel):
    """No unknown keys, no silent coercion (true is not 1, 2.5 is not an int), immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)



def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
