"""The registry of ``pyg-sar`` subcommands: each command module calls
:func:`register_command` when imported. Nothing here imports torch."""
import argparse
from dataclasses import dataclass
from typing import Callable, Dict, Optional


@dataclass
class Command:
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], Optional[int]]


COMMANDS: Dict[str, Command] = {}


def register_command(
    name: str,
    help: str,
    configure: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], Optional[int]],
) -> None:
    r"""Registers the subcommand :obj:`name`: :obj:`configure` adds its
    arguments to an :class:`argparse.ArgumentParser`, :obj:`run` executes it
    and returns an exit code (:obj:`None` means 0)."""
    if name in COMMANDS:
        raise ValueError(f"Subcommand '{name}' is already registered")
    COMMANDS[name] = Command(help=help, configure=configure, run=run)
