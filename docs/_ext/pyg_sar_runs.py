"""Commands and their recorded output (see ``recorded_runs.py``).

``.. pyg-sar-run:: NAME`` with the commands as content renders them as a
``bash`` block; the build stops when ``docs/_generated/NAME.txt`` records
other commands (or none). ``.. pyg-sar-output:: NAME`` renders what they
printed (``:command: K``: the K-th command's output; default the last).
"""
from __future__ import annotations

from typing import Any, Dict, List

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.directives.code import container_wrapper
from sphinx.errors import ExtensionError
from sphinx.util.docutils import SphinxDirective

from recorded_runs import (HOW_TO_RECORD, parse_commands, read_recording,
                           recording_path)


def _recording(directive: SphinxDirective, name: str):
    directive.env.note_dependency(recording_path(name))
    try:
        return read_recording(name)
    except FileNotFoundError as e:
        raise ExtensionError(f'{directive.name}: {e}') from None


class RunDirective(SphinxDirective):
    """``.. pyg-sar-run:: NAME`` and the commands."""

    required_arguments = 1
    has_content = True

    def run(self) -> List[nodes.Node]:
        name = self.arguments[0]
        commands = parse_commands(list(self.content))
        recorded = [command for command, _ in _recording(self, name)]
        if recorded != commands:
            raise ExtensionError(
                f'pyg-sar-run {name}: the page runs {commands} but '
                f'docs/_generated/{name}.txt records {recorded}: record it '
                f'again with {HOW_TO_RECORD}')
        text = '\n'.join(self.content).strip('\n')
        block = nodes.literal_block(text, text, language='bash')
        self.set_source_info(block)
        return [block]


class OutputDirective(SphinxDirective):
    """``.. pyg-sar-output:: NAME``: what the run printed."""

    required_arguments = 1
    option_spec = {'command': directives.positive_int}

    def run(self) -> List[nodes.Node]:
        name = self.arguments[0]
        run = _recording(self, name)
        k = self.options.get('command', len(run))
        if k > len(run):
            raise ExtensionError(f'pyg-sar-output {name}: no command {k} '
                                 f'(the run has {len(run)})')
        text = '\n'.join(run[k - 1][1])
        block = nodes.literal_block(text, text, language='text')
        self.set_source_info(block)
        caption = 'Printed (recorded by tests/examples/test_quickstart.py)'
        return [container_wrapper(self, block, caption)]


def setup(app: Sphinx) -> Dict[str, Any]:
    app.add_directive('pyg-sar-run', RunDirective)
    app.add_directive('pyg-sar-output', OutputDirective)
    return {'version': '1.0', 'parallel_read_safe': True,
            'parallel_write_safe': True}
