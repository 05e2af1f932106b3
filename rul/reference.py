"""The reference pages, generated from the typed config (rul/config/) and the CLI itself.

Each key's type, default and allowed values come from its pydantic field (the field's
`description` is what an error says a value must be); its meaning is the attribute docstring
written under the field. `config_reference()` is docs/reference/configuration.md, kept in the
checkout (a reader of the repository finds it without a docs build; tests/test_reference.py
fails when it is not current, and RUL_WRITE_DOCS=1 rewrites it); the docs build renders
`cli_reference()` (docs/hooks.py), so the pages can never disagree with the code;
tests/test_reference.py fails when a key has no meaning.
"""

import ast
import inspect
import textwrap
import types
import typing
from pathlib import Path

import yaml
from pydantic import BaseModel

from rul.config import Categorical, FloatRange, IntRange, TrainConfig, TuningConfig
from rul.config.data import DataSection

ROOT = Path(__file__).resolve().parents[1]
CONFIG_PAGE = ROOT / "docs" / "reference" / "configuration.md"  # config_reference(), committed
MAKE_TRAIN_CONFIG = ROOT / "experiments" / "fd001.yaml"


def field_meanings(model: type[BaseModel]) -> dict[str, str]:
    """{field: its attribute docstring, on one line} for the fields `model` and the models it
    extends declare."""
    meanings = {}
    for declaring in reversed([c for c in model.__mro__ if c.__module__.startswith("rul.")]):
        (cls,) = ast.parse(textwrap.dedent(inspect.getsource(declaring))).body
        for field, after in zip(cls.body, cls.body[1:]):
            if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                meanings[field.target.id] = " ".join(after.value.value.split())
    return meanings


def type_name(annotation) -> str:
    """A reader's name for a field's type: integer, number, boolean, string, choice, list of
    strings, mapping, ... joined with "or"; None reads as null."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        names = []
        for arg in args:
            name = "null" if arg is type(None) else type_name(arg)
            if name not in names:
                names.append(name)
        return " or ".join(names)
    if origin is typing.Literal:
        return "choice" if len(args) > 1 else str(args[0])
    if origin is list:
        inner = type_name(args[0])
        return f"list of {inner}s" if " or " not in inner else "list"
    if origin is dict:
        return "mapping"
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return "mapping"
    return {int: "integer", float: "number", bool: "boolean", str: "string"}.get(
        annotation, getattr(annotation, "__name__", str(annotation)))


def default_text(field) -> str:
    """The default as it would be written in YAML."""
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        return "(its own defaults)"
    value = field.default
    if isinstance(value, float):
        return repr(value)
    return _yaml(value)


def _yaml(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def allowed_values(field) -> str:
    """What a value must be: the field's description (the config errors' wording), or the
    choices of a bare Literal."""
    if field.description:
        return field.description
    if typing.get_origin(field.annotation) is typing.Literal:
        return "one of " + ", ".join(map(str, typing.get_args(field.annotation)))
    return ""


def _cell(text: str) -> str:
    """A table cell: pipes escaped, and < > outside `code` spans (e.g. rul-<subset>) kept."""
    parts = text.replace("|", "\\|").replace("\n", " ").split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;").replace(">", "&gt;")
                    for i, part in enumerate(parts))


def key_table(model: type[BaseModel], skip: tuple[str, ...] = ()) -> list[str]:
    meanings = field_meanings(model)
    lines = ["| key | type | default | allowed values | meaning |",
             "| --- | --- | --- | --- | --- |"]
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        default = default_text(field)
        cells = [f"`{name}`", type_name(field.annotation),
                 default if field.is_required() else f"`{default}`",
                 allowed_values(field), meanings.get(name, "")]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _make_train_overrides() -> list[str]:
    values = yaml.safe_load(MAKE_TRAIN_CONFIG.read_text()) or {}
    changed = {k: v for k, v in values.items()
               if k in TrainConfig.model_fields and v != TrainConfig.model_fields[k].default}
    return [f"`{k}: {_yaml(v)}`" for k, v in changed.items()]


def config_reference() -> str:
    """The Markdown page docs/reference/configuration.md."""
    overrides = ", ".join(_make_train_overrides()) or "nothing"
    lines = [
        "# Configuration keys",
        "",
        "Generated from `rul/config/` (`rul.reference`): every key `rul train`, "
        "`rul evaluate` and `rul tune` read, with its type, default, allowed values and "
        "meaning. A YAML file in `experiments/` or a `key=value` argument overrides a "
        "default; an unknown key or a value outside the allowed ones is a one-line error "
        "before any work starts.",
        "",
        f"`make train` trains `experiments/{MAKE_TRAIN_CONFIG.name}`, which changes "
        f"{overrides} from the defaults below: they are its recipe, in one place.",
        "",
        "## Training keys",
        "",
        "Read by `rul train` and `rul evaluate` (and by `rul tune` as the base of every "
        "trial).",
        "",
        *key_table(TrainConfig),
        "",
        "## Tuning keys",
        "",
        "Read by `rul tune` only. In a tuning YAML file they sit at the top level, beside "
        "the training keys of the trials' base config.",
        "",
        *key_table(TuningConfig, skip=("train",)),
        "",
        "## Data-set keys",
        "",
        "The keys of the `data:` section, which describes a data set of your own by its "
        "columns ([Train on your own fleet](../guides/fleet.md)); `subset: FD001` stands for "
        "the same section with NASA's files and columns.",
        "",
        *key_table(DataSection),
        "",
        "## Search-space entries",
        "",
        "Each entry of `search_space` maps a training key to one of these distributions, "
        "e.g. `lr: {type: float, low: 0.0003, high: 0.003, log: true}`.",
        "",
    ]
    for kind, model in (("categorical", Categorical), ("int", IntRange),
                        ("float", FloatRange)):
        lines += [f"### `type: {kind}`", "", *key_table(model), ""]
    return "\n".join(lines)


# ------------------------------------------------------------------ the command line


def _param_row(param, ctx) -> list[str]:
    import click

    info = param.to_info_dict()  # its default is None where click has none
    if isinstance(param, click.Argument):
        name = f"`{param.make_metavar(ctx)}`"
    else:
        flags = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
        name = flags if param.is_flag else f"{flags} `{param.make_metavar(ctx)}`"
    default = info.get("default")
    shown = "" if default in (None, False, (), []) or param.is_flag is True else f"`{default}`"
    return [name, " ".join((getattr(param, "help", None) or "").split()), shown]


def cli_reference() -> str:
    """The Markdown page docs/reference/cli.md: every command of `rul`, its usage and its
    arguments and options, read from the click commands themselves."""
    import click

    from rul.cli import main

    root = click.Context(main, info_name="rul")
    lines = ["# Command line", "",
             "Generated from the `rul` command itself when the docs are built; each command "
             "prints the same with `--help`. Bad input (a config key, a value, a file) is one "
             "line naming the file, key or field and what is wrong, exit code 2, and nothing "
             "is started.", ""]
    for name in sorted(main.list_commands(root)):
        command = main.get_command(root, name)
        ctx = click.Context(command, info_name=name, parent=root)
        pieces = command.collect_usage_pieces(ctx)
        lines += [f"## rul {name}", "", "```text", f"rul {name} {' '.join(pieces)}", "```", "",
                  inspect.cleandoc(command.help or ""), ""]
        rows = [_param_row(p, ctx) for p in command.get_params(ctx)]
        lines += ["| argument or option | meaning | default |", "| --- | --- | --- |",
                  *("| " + " | ".join(_cell(c) for c in row) + " |" for row in rows), ""]
    return "\n".join(lines)


def odd_inputs_reference() -> str:
    """The Markdown page docs/reference/odd-inputs.md, from rul.preprocessing.odd_inputs."""
    from rul.preprocessing.odd_inputs import POLICY

    lines = [
        "# Odd inputs",
        "",
        "Generated from `rul/preprocessing/odd_inputs.py` when the docs are built: one policy "
        "for rows that are valid C-MAPSS but unlike what a model should learn from or be "
        "asked about, the same in training and in serving. Training judges the engines of "
        "its training file against each other (they are the fleet): each kind it finds is "
        "named once, with its units, in a warning, recorded on the run as the tag "
        "`data.odd.<kind>`, and trained on; `strict_data: true` refuses the file instead. A "
        "served model judges each engine of a request against the fleet it trained on "
        "([predict and serve](../guides/serve.md#inputs-outside-the-training-fleet)).",
        "",
        "| kind | found when | training | serving |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| `{k.key}` | {_cell(k.found)} | {_cell(k.training)} | {_cell(k.serving)} |"
              for k in POLICY]
    return "\n".join(lines) + "\n"
