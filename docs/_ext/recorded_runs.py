"""The commands the documentation runs, and what they printed.

A page names a run with ``.. pyg-sar-run:: NAME`` followed by its commands
(one per line; a trailing backslash continues a line) and shows what they
printed with ``.. pyg-sar-output:: NAME`` (``pyg_sar_runs.py``). The output
is recorded in ``docs/_generated/NAME.txt`` by running the commands as a
user does (``tests/examples/test_quickstart.py``, with ``PYG_SAR_RECORD_RUNS=1``), and
the same tests run them again and compare (:func:`differences`), so a page
cannot show output the command no longer prints.

A recording holds each command on a line of its own after ``$ ``, followed
by what it printed. Plain Python, no Sphinx: the tests read it too.
"""
from __future__ import annotations

import glob
import os.path as osp
import re
from typing import Dict, List, Tuple

DOCS = osp.dirname(osp.dirname(osp.abspath(__file__)))
RECORDINGS = osp.join(DOCS, '_generated')
RECORD_ENV = 'PYG_SAR_RECORD_RUNS'
HOW_TO_RECORD = (f'{RECORD_ENV}=1 python -m pytest tests/examples/test_quickstart.py '
                 f'-k test_documented_run')

_DIRECTIVE = re.compile(r'^\.\. pyg-sar-run:: *(\S+) *\n'
                        r'((?:[ \t]*\n|[ \t]+\S.*\n)*)', re.MULTILINE)
# A number; a following "s" makes it a duration (compared as text only).
_NUMBER = re.compile(r'\d+(?:\.\d+)?(?:e[-+]?\d+)?(s\b)?')
# Numbers may differ this much between machines (float rounding, other
# kernels, another METIS build) before a recording counts as stale.
RTOL, ATOL = 0.03, 0.01

Run = List[Tuple[str, List[str]]]  # [(command, printed lines), ...]


def parse_commands(lines: List[str]) -> List[str]:
    """The commands of a directive's content, continuation lines joined and
    whitespace collapsed."""
    commands, current = [], ''
    for line in lines:
        line = line.strip()
        if not line and not current:
            continue
        current += ' ' + line
        if current.endswith('\\'):
            current = current[:-1]
            continue
        commands.append(' '.join(current.split()))
        current = ''
    if current.strip():
        commands.append(' '.join(current.split()))
    return commands


def documented_runs(docs: str = DOCS) -> Dict[str, List[str]]:
    """Every ``pyg-sar-run`` of the pages: ``{name: commands}``."""
    runs: Dict[str, List[str]] = {}
    for path in sorted(glob.glob(osp.join(docs, '**', '*.rst'),
                                 recursive=True)):
        with open(path, encoding='utf-8') as f:
            text = f.read()
        for match in _DIRECTIVE.finditer(text):
            name = match.group(1)
            if name in runs:
                raise ValueError(f'{osp.relpath(path, docs)}: the run '
                                 f'{name!r} is documented twice')
            runs[name] = parse_commands(match.group(2).splitlines())
    return runs


def recording_path(name: str) -> str:
    return osp.join(RECORDINGS, f'{name}.txt')


def read_recording(name: str) -> Run:
    path = recording_path(name)
    if not osp.exists(path):
        raise FileNotFoundError(f'no recording of the run {name!r} '
                                f'({osp.relpath(path, osp.dirname(DOCS))}): '
                                f'record it with {HOW_TO_RECORD}')
    run: Run = []
    with open(path, encoding='utf-8') as f:
        for line in f.read().splitlines():
            if line.startswith('$ '):
                run.append((line[2:], []))
            elif run:
                run[-1][1].append(line)
    return run


def write_recording(name: str, run: Run) -> None:
    with open(recording_path(name), 'w', encoding='utf-8') as f:
        for command, lines in run:
            f.write(f'$ {command}\n')
            f.writelines(f'{line}\n' for line in lines)


def _close(want: str, got: str) -> bool:
    a, b = float(want), float(got)
    return abs(a - b) <= ATOL + RTOL * abs(a)


def differences(recorded: List[str], printed: List[str]) -> List[str]:
    """How ``printed`` departs from ``recorded``: the same lines once every
    number is masked, the numbers within :data:`RTOL` / :data:`ATOL` of the
    recorded ones, durations (``0.12s``) free. Empty when they agree."""
    out = []
    if len(recorded) != len(printed):
        out.append(f'{len(printed)} lines printed, {len(recorded)} recorded')
    for k, (want, got) in enumerate(zip(recorded, printed), 1):
        if _NUMBER.sub('#', want) != _NUMBER.sub('#', got):
            out.append(f'line {k}: {got!r}, recorded {want!r}')
            continue
        for a, b in zip(_NUMBER.finditer(want), _NUMBER.finditer(got)):
            if not a.group(1) and not _close(a.group(0), b.group(0)):
                out.append(f'line {k}: {b.group(0)} where {a.group(0)} was '
                           f'recorded ({got!r})')
    return out
