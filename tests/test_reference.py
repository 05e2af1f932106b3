"""The configuration reference is generated from rul/config/: every key, with a meaning."""

import html
import os

import pytest

from rul import config as cfg
from rul.config import Categorical, FloatRange, IntRange, TrainConfig, TuningConfig
from rul.reference import (
    CONFIG_PAGE,
    cli_reference,
    config_reference,
    field_meanings,
    type_name,
)

MODELS = (TrainConfig, TuningConfig, Categorical, IntRange, FloatRange)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_key_has_a_meaning(model):
    """A key added without an attribute docstring under its field fails here."""
    meanings = field_meanings(model)
    assert [name for name in model.model_fields if not meanings.get(name)] == []


def test_the_generated_page_lists_every_key_with_its_meaning():
    page = html.unescape(config_reference())  # rul-&lt;subset&gt; reads rul-<subset>
    for model in MODELS:
        meanings = field_meanings(model)
        for name in model.model_fields:
            if model is TuningConfig and name == "train":  # its keys are the training keys
                continue
            row = next((line for line in page.splitlines() if line.startswith(f"| `{name}` |")
                        and meanings.get(name, "?") in line), None)
            assert row is not None, f"{model.__name__}.{name} missing from the reference"
    window = next(line for line in page.splitlines() if line.startswith("| `window` |"))
    assert window.split(" | ")[1:4] == ["integer", "`30`", "a positive integer"]


def test_the_configuration_page_in_the_checkout_is_current():
    """docs/reference/configuration.md is config_reference(): a key added, renamed or
    explained anew fails here until RUL_WRITE_DOCS=1 rewrites the page."""
    if os.environ.get("RUL_WRITE_DOCS") == "1":
        CONFIG_PAGE.write_text(config_reference() + "\n")
    assert CONFIG_PAGE.read_text() == config_reference() + "\n", (
        "docs/reference/configuration.md: RUL_WRITE_DOCS=1 pytest tests/test_reference.py")


def test_meanings_leave_the_error_messages_alone():
    """A field's description stays what an error says its value must be."""
    assert TrainConfig.model_fields["window"].description == "a positive integer"
    with pytest.raises(cfg.ConfigError, match=r"window=0: must be a positive integer$"):
        cfg.load(None, ["window=0"])


def test_a_docstring_is_read_as_the_meaning_of_the_field_above_it():
    assert field_meanings(TrainConfig)["window"].startswith("Cycles per input window")
    assert "patience" not in field_meanings(TuningConfig)


def test_type_names_read_as_a_user_would_write_them():
    fields = TrainConfig.model_fields
    assert type_name(fields["micro_batch_size"].annotation) == "integer or auto"
    assert type_name(fields["max_grad_norm"].annotation) == "number or null"
    assert type_name(fields["features"].annotation) == "string or list of strings"
    assert type_name(TuningConfig.model_fields["search_space"].annotation) == "mapping"


def test_the_cli_page_lists_every_command_and_option():
    import click

    from rul.cli import main

    page = cli_reference()
    ctx = click.Context(main, info_name="rul")
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        assert f"## rul {name}" in page
        section = page.split(f"## rul {name}\n")[1].split("\n## ")[0]
        for param in command.params:
            if isinstance(param, click.Option):
                assert f"`{param.opts[0]}`" in section, f"rul {name} {param.opts[0]}"
    section = page.split("## rul predict\n")[1].split("\n## ")[0]
    assert "| `--short-history` `[pad\\|reject]` |" in section and section.count("| `pad` |") == 1
    assert "runs:/&lt;id&gt;/model" in section  # an HTML-looking help text stays visible
