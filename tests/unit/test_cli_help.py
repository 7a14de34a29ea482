"""The CLI's help texts read alike: a command's or group's help, and every option's, is a
sentence (capital letter first, or a name such as vLLM; a final period for options), every
option has help, and no help shows raw reStructuredText ``backticks``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from typer.main import get_command

from services.cli.main import build_app


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def _starts_a_sentence(text: str) -> bool:
    first_word = text.strip().split(" ", 1)[0]
    return first_word[:1].isupper() or any(c.isupper() for c in first_word)


def test_help_texts_are_consistent() -> None:
    problems = []
    for path, command in _commands(get_command(build_app())):
        text = (command.help or "").strip()
        if not text or not text[0].isupper():
            problems.append(f"{' '.join(path) or 'convplane'}: help must start a sentence")
        if "``" in text:
            problems.append(f"{' '.join(path)}: raw ``backticks`` in its help")
        for param in command.params:
            if type(param).__name__.endswith("Option") and param.name != "help":
                if not (param.help or "").strip():
                    problems.append(f"{' '.join(path)} --{param.name}: no help")
                elif "``" in param.help:
                    problems.append(f"{' '.join(path)} --{param.name}: raw ``backticks``")
                elif not _starts_a_sentence(param.help) or not param.help.rstrip().endswith("."):
                    problems.append(f"{' '.join(path)} --{param.name}: not a sentence")
    assert not problems, "\n".join(problems)
