"""The generated documents match the code they describe."""

from __future__ import annotations

from docs_gen import CLI_MD, CONFIGURATION_MD, cli_markdown, configuration_markdown

REGENERATE = "stale: run `PYTHONPATH=. python3 tests/docs_gen.py` and commit docs/"


def test_cli_reference_is_current() -> None:
    assert CLI_MD.read_text() == cli_markdown(), f"docs/cli.md is {REGENERATE}"


def test_cli_reference_names_every_command_and_option() -> None:
    from typer.main import get_command

    from ckptz.cli import app

    text = CLI_MD.read_text()
    group = get_command(app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        assert f"## `ckptz {name}`" in text
        for param in command.params:
            for opt in param.opts if param.param_type_name == "option" else ():
                assert f"`{opt}`" in text, (name, opt)


def test_settings_table_is_current() -> None:
    current = CONFIGURATION_MD.read_text()
    assert current == configuration_markdown(current), f"docs/configuration.md's table is {REGENERATE}"
