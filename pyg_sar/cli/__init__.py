"""The last stage, the command line: ``pyg-sar partition``, ``info``,
``train`` and ``demo``, each a module that registers its subcommand
(:mod:`~pyg_sar.cli.registry`), and :func:`main`, which turns a refused input
or a dead peer into one line per failing rank. Building the parser imports no
torch; a subcommand imports the stages it drives when it runs.
"""
from pyg_sar.cli.main import build_parser, main
from pyg_sar.cli.registry import COMMANDS, register_command

__all__ = ['main', 'build_parser', 'register_command', 'COMMANDS']
