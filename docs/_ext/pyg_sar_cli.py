"""The command-line reference, generated from the argparse parser.

``.. pyg-sar-cli:: pyg_sar.cli:build_parser`` calls the function after the
colon and renders the program's usage and options, then one section per
subcommand: its description, usage and every argument (grouped as argparse
groups them, with defaults and required flags). The help text is the
parser's own, so the page cannot drift from ``pyg-sar --help``.

argparse has no public API to walk a parser; like ``argparse`` itself (and
sphinx-argparse) this reads ``_actions`` and ``_action_groups`` and formats
through :class:`argparse.HelpFormatter`.
"""
from __future__ import annotations

import argparse
import importlib
import re
from typing import Any, Dict, List, Optional

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

# Usage lines are wrapped at this width, whatever the terminal's.
WIDTH = 79


def _formatter(parser: argparse.ArgumentParser) -> argparse.HelpFormatter:
    return parser.formatter_class(prog=parser.prog, width=WIDTH)


def _usage(parser: argparse.ArgumentParser) -> nodes.literal_block:
    formatter = _formatter(parser)
    formatter.add_usage(parser.usage, parser._actions,
                        parser._mutually_exclusive_groups)
    text = formatter.format_help().strip()
    block = nodes.literal_block(text, text)
    block['language'] = 'text'
    return block


def _subcommands(parser: argparse.ArgumentParser
                 ) -> Dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


# An option named in help text (``--out``), not a hyphenated word.
_OPTION = re.compile(r'(?<![\w-])(--?[A-Za-z][\w-]*)')


def _help_text(text: str) -> List[nodes.Node]:
    """``text`` with the options it names as literals (which also keeps
    smart quotes from turning ``--out`` into an en dash)."""
    out: List[nodes.Node] = []
    for i, part in enumerate(_OPTION.split(text)):
        if part:
            out.append(nodes.literal(text=part) if i % 2 else
                       nodes.Text(part))
    return out


def _paragraph(text: str) -> nodes.paragraph:
    paragraph = nodes.paragraph()
    paragraph += _help_text(text)
    return paragraph


def _default(action: argparse.Action) -> Optional[str]:
    """The default to state, when the help does not already say it."""
    if action.default in (None, False, argparse.SUPPRESS) or \
            action.required or not action.option_strings or \
            '%(default)' in (action.help or '') or \
            isinstance(action, (argparse._StoreTrueAction,
                                argparse._StoreFalseAction)):
        return None
    return repr(action.default) if isinstance(action.default, str) \
        else str(action.default)


def _argument(parser: argparse.ArgumentParser,
              action: argparse.Action) -> nodes.definition_list_item:
    formatter = _formatter(parser)
    term = nodes.term()
    term += nodes.literal(text=formatter._format_action_invocation(action))
    notes = []
    if action.option_strings and action.required:
        notes.append('required')
    default = _default(action)
    if default is not None:
        notes.append(f'default: {default}')
    text = formatter._expand_help(action) if action.help else ''
    if notes:
        text = f"{text} ({', '.join(notes)})".strip()
    return nodes.definition_list_item('', term, nodes.definition(
        '', _paragraph(text)))


def _arguments(parser: argparse.ArgumentParser) -> List[nodes.Node]:
    """The arguments of ``parser``, one definition list per argparse group
    (``-h/--help`` and subcommands left out)."""
    out = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if not isinstance(
            a, (argparse._HelpAction, argparse._SubParsersAction))]
        if not actions:
            continue
        out.append(nodes.rubric(text=group.title.capitalize()))
        items = nodes.definition_list()
        items += [_argument(parser, action) for action in actions]
        out.append(items)
    return out


def _section_id(prog: str) -> str:
    return nodes.make_id(prog)


class CliDirective(SphinxDirective):
    """``.. pyg-sar-cli:: MODULE:FUNCTION`` (a function that returns the
    :class:`argparse.ArgumentParser`)."""

    required_arguments = 1

    def _parser(self) -> argparse.ArgumentParser:
        module_name, _, function = self.arguments[0].partition(':')
        try:
            build = getattr(importlib.import_module(module_name), function)
        except (ImportError, AttributeError) as e:
            raise self.error(f'pyg-sar-cli: cannot load {self.arguments[0]}:'
                             f' {e}') from e
        return build()

    def run(self) -> List[nodes.Node]:
        parser = self._parser()
        out: List[nodes.Node] = []
        if parser.description:
            out.append(_paragraph(parser.description))
        out.append(_usage(parser))
        commands = _subcommands(parser)
        if commands:
            out.append(nodes.rubric(text='Commands'))
            listing = nodes.definition_list()
            for name, sub in commands.items():
                link = nodes.reference('', '', refid=_section_id(sub.prog))
                link += nodes.literal(text=name)
                listing += nodes.definition_list_item(
                    '', nodes.term('', '', link), nodes.definition(
                        '', _paragraph(sub.description or '')))
            out.append(listing)
        out += _arguments(parser)
        for sub in commands.values():
            out.append(self._command_section(sub))
        return out

    def _command_section(self, sub: argparse.ArgumentParser
                         ) -> nodes.section:
        section = nodes.section(ids=[_section_id(sub.prog)],
                                names=[nodes.fully_normalize_name(sub.prog)])
        section += nodes.title('', '', nodes.literal(text=sub.prog))
        if sub.description:
            section += _paragraph(sub.description)
        section += _usage(sub)
        section += _arguments(sub)
        self.state.document.note_implicit_target(section, section)
        return section


def setup(app: Sphinx) -> Dict[str, Any]:
    app.add_directive('pyg-sar-cli', CliDirective)
    return {'version': '1.0', 'parallel_read_safe': True,
            'parallel_write_safe': True}
