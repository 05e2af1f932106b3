"""The command line knows a user's mistake by its type: every InputError (rul.errors) ends the
command with its one line and exit code 2, whichever module defines it, a new one included,
and nothing else is taken for one."""

import pytest
from click.testing import CliRunner

from rul.cli import main
from rul.errors import InputError


class SomethingNew(InputError):
    """An error a future module adds: no list of the command line's names it."""


@pytest.mark.parametrize("error, code, said", [
    (SomethingNew("data.sensors: no column 'P3O'"), 2, "Error: data.sensors: no column 'P3O'"),
    (FileNotFoundError("nothing to resume"), 2, "Error: nothing to resume"),
])
def test_an_input_error_of_any_module_is_one_line_and_exit_2(monkeypatch, write_cmapss,
                                                            error, code, said):
    import rul.workflows.train

    def fails(*args, **kwargs):
        raise error

    monkeypatch.setattr(rul.workflows.train, "train_tracked", fails)
    result = CliRunner().invoke(main, ["train", f"data_dir={write_cmapss()}", "epochs=1"])
    assert result.exit_code == code
    assert result.stderr == said + "\n"


def test_a_fault_of_rul_is_not_taken_for_a_users_mistake(monkeypatch, write_cmapss):
    import rul.workflows.train

    def fails(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(rul.workflows.train, "train_tracked", fails)
    result = CliRunner().invoke(main, ["train", f"data_dir={write_cmapss()}", "epochs=1"])
    assert result.exit_code == 1 and isinstance(result.exception, RuntimeError)
