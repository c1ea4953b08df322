"""The ``pyg-sar`` entry point: builds the parser from the registered
subcommands and turns a refused input or a failed peer into one line.

``pyg-sar --help`` and ``pyg-sar --version`` import no torch: a subcommand's
arguments are added only when that subcommand is run (its module imports
torch inside its ``run``)."""
import argparse
import os
import sys
import traceback
from typing import List, Optional

# Importing a command module registers its subcommand.
from pyg_sar.cli import partition, train, demo  # noqa: F401,I001
from pyg_sar.cli.registry import COMMANDS
from pyg_sar.utils.version import __version__


def build_parser(command: Optional[str] = '*') -> argparse.ArgumentParser:
    r"""The argument parser of ``pyg-sar``. Every subcommand is listed; the
    arguments are added for :obj:`command` only (all of them by default,
    none for :obj:`None`), so that ``pyg-sar --help`` stays fast."""
    parser = argparse.ArgumentParser(
        prog='pyg-sar',
        description='Distributed full-batch GNN training for PyG')
    parser.add_argument('--version', action='version',
                        version=f'pyg-sar {__version__}')
    subparsers = parser.add_subparsers(dest='command', required=True,
                                       metavar='COMMAND')
    for name, entry in COMMANDS.items():
        subparser = subparsers.add_parser(name, help=entry.help,
                                          description=entry.help)
        if command in ('*', name):
            entry.configure(subparser)
    return parser


def _command_of(argv: List[str]) -> Optional[str]:
    for arg in argv:
        if not arg.startswith('-'):
            return arg if arg in COMMANDS else '*'
    return None


def main(argv: Optional[List[str]] = None) -> int:
    r"""Entry point of the ``pyg-sar`` console script.

    A refused input or a failed peer ends the command with one line on
    stderr (naming the rank under ``torchrun``) and exit code 2 (refused
    input) or 3 (a peer died or hung); ``PYG_SAR_TRACEBACK=1`` adds the
    traceback."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_command_of(argv)).parse_args(argv)
    from pyg_sar.comm.errors import PeerError  # torch: after --help

    try:
        code = COMMANDS[args.command].run(args)
    except (ValueError, TypeError, OSError, ImportError, FloatingPointError,
            PeerError) as e:
        # OSError: a path, a permission, a download (ConnectionError).
        if os.environ.get('PYG_SAR_TRACEBACK', '0') not in ('', '0'):
            traceback.print_exc()
        where = f" (rank {os.environ['RANK']})" if 'RANK' in os.environ \
            and not isinstance(e, (PeerError, ImportError)) else ''
        # One write, so that the lines of several ranks do not interleave.
        sys.stderr.write(f'pyg-sar {args.command}: error{where}: {e}\n')
        sys.stderr.flush()
        if not isinstance(e, PeerError):  # peers then name this rank
            from pyg_sar.comm.errors import report_failure
            report_failure(f'{type(e).__name__}: {e}')
        return 3 if isinstance(e, PeerError) else 2
    return 0 if code is None else int(code)
