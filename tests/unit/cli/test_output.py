"""`errors_as_exit`: our errors become one message with their notes, and the exit code of their kind."""

from __future__ import annotations

import pytest
import typer

from examlops.cli import output
from examlops.core.errors import RegistryUnavailable


def test_an_error_becomes_its_exit_code_and_its_message_keeps_the_notes(capsys: pytest.CaptureFixture[str]) -> None:
    error = RegistryUnavailable("the MLflow registry cannot be reached: timed out")
    error.add_note("its move_failed audit event was not written either: redis is down")
    with pytest.raises(typer.Exit) as exited, output.errors_as_exit():
        raise error
    assert exited.value.exit_code == output.exit_code_of(error)
    said = " ".join(capsys.readouterr().err.split())
    assert "cannot be reached: timed out; its move_failed audit event was not written either: redis is down" in said
