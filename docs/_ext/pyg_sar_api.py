"""The API reference of one module, generated from its public names.

``.. pyg-sar-api:: pyg_sar.partition`` renders the module's docstring
(``automodule``), an ``autosummary`` table of its public names and one
autodoc entry per name, so a page follows the module's ``__all__`` and
cannot drift from it. Options:

``:names:``
    The names to document, when not the module's ``__all__`` (without an
    ``__all__``: the classes and functions the module defines).
``:defer-to:``
    Modules documented elsewhere: a name that is the same object as one in
    their ``__all__`` is only listed, and links to that entry (``pyg_sar.nn``
    re-exports the convolutions that ``pyg_sar.nn.conv`` documents).
``:no-docstring:``
    Leave the module's docstring out (it is documented on another page):
    the names are documented under the module's path, as the package
    reaches them (``pyg_sar.comm``'s plumbing, on the internals page).

The extension also resolves references that name an object by another
public path than the documented one: ``pyg_sar.DistGraph`` (the lazy
top-level facade), ``pyg_sar.link`` or a bare ``DistGraph`` in a docstring
whose module imports it. Python's own name resolution decides: the target is
imported (or looked up in the globals of the module that defines the
documented object) and linked to wherever that object is documented.
"""
from __future__ import annotations

import importlib
import inspect
from types import ModuleType
from typing import Any, Dict, Iterable, List, Optional

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util.docutils import SphinxDirective
from sphinx.util.parsing import nested_parse_to_nodes

# A constant whose value would not fit on a line or two is described by its
# type and size instead (``ADAPTED``: "tuple of 24 classes").
MAX_VALUE_CHARS = 160


def _word_list(argument: Optional[str]) -> List[str]:
    return (argument or '').replace(',', ' ').split()


def public_names(module: ModuleType) -> List[str]:
    """``__all__``, else the classes and functions ``module`` defines, in
    the order it defines them."""
    if hasattr(module, '__all__'):
        return list(module.__all__)
    return [name for name, obj in vars(module).items()
            if not name.startswith('_')
            and (inspect.isclass(obj) or inspect.isfunction(obj))
            and obj.__module__ == module.__name__]


def _relative(target: str, current: str) -> str:
    """The dotted name ``target`` as seen from the module ``current``
    (autosummary wants the names of its submodules relative to it)."""
    if target.startswith(current + '.'):
        return target[len(current) + 1:]
    return target


def _short_repr(value: Any) -> str:
    """``repr(value)``, with classes by their name."""
    if inspect.isclass(value):
        return value.__name__
    if isinstance(value, (tuple, list)):
        items = ', '.join(_short_repr(v) for v in value)
        if isinstance(value, list):
            return f'[{items}]'
        return f'({items},)' if len(value) == 1 else f'({items})'
    if isinstance(value, dict):
        return '{' + ', '.join(f'{_short_repr(k)}: {_short_repr(v)}'
                               for k, v in value.items()) + '}'
    return repr(value)


def _value_annotation(value: Any) -> Optional[str]:
    """What to show for a constant's value when not its ``repr`` (too
    long, or with classes in it), or ``None`` for the ``repr``."""
    text = _short_repr(value)
    if len(text) <= MAX_VALUE_CHARS:
        return None if text == repr(value) else f'= {text}'
    kind = type(value).__name__
    if isinstance(value, (tuple, list, set, frozenset)):
        what = ('classes' if all(inspect.isclass(v) for v in value)
                else 'items')
        return f': {kind} of {len(value)} {what}'
    if isinstance(value, dict):
        return f': {kind} of {len(value)} entries'
    return f': {kind}'


class ApiDirective(SphinxDirective):
    """``.. pyg-sar-api:: MODULE``: see the module docstring."""

    required_arguments = 1
    option_spec = {
        'names': directives.unchanged,
        'defer-to': directives.unchanged,
        'no-docstring': directives.flag,
    }

    def run(self) -> List[nodes.Node]:
        module_name = self.arguments[0]
        module = self._import(module_name)
        names = _word_list(self.options.get('names')) or public_names(module)
        deferred = self._deferred(module, names)

        lines = [f'.. currentmodule:: {module_name}'
                 if 'no-docstring' in self.options
                 else f'.. automodule:: {module_name}', '']
        if names:
            lines += ['.. rubric:: Summary', '',
                      '.. autosummary::', '   :nosignatures:', '']
            lines += [f'   ~{_relative(deferred[n], module_name)}'
                      if n in deferred else f'   {n}' for n in names]
            lines.append('')
        for name in names:
            if name in deferred:
                continue
            try:
                obj = getattr(module, name)
            except AttributeError as e:
                raise self.error(f'pyg-sar-api: {module_name} has no '
                                 f'public name {name!r}') from e
            lines += self._entry(name, obj)
        source = f'<pyg-sar-api {module_name}>'
        return nested_parse_to_nodes(self.state,
                                     StringList(lines, source=source))

    def _import(self, module_name: str) -> ModuleType:
        try:
            return importlib.import_module(module_name)
        except ImportError as e:
            raise self.error(f'pyg-sar-api: cannot import {module_name}: '
                             f'{e}') from e

    def _deferred(self, module: ModuleType,
                  names: Iterable[str]) -> Dict[str, str]:
        """name -> the documented name to link to instead (a module in
        ``__all__`` is a section of its own, documented elsewhere)."""
        others = [self._import(m) for m in
                  _word_list(self.options.get('defer-to'))]
        deferred = {}
        for name in names:
            obj = getattr(module, name, None)
            if inspect.ismodule(obj):
                deferred[name] = obj.__name__
                continue
            for other in others:
                if name in getattr(other, '__all__', ()) and \
                        getattr(other, name) is obj:
                    deferred[name] = f'{other.__name__}.{name}'
                    break
        return deferred

    @staticmethod
    def _entry(name: str, obj: Any) -> List[str]:
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            lines = [f'.. autoexception:: {name}']
        elif inspect.isclass(obj):
            lines = [f'.. autoclass:: {name}', '   :members:']
            if obj.__bases__ != (object, ):
                lines.append('   :show-inheritance:')
            # A class's ``_doc_internal`` methods serve the package itself:
            # named in one line, not documented as the user's API.
            internal = [m for m in getattr(obj, '_doc_internal', ())
                        if m in vars(obj)]
            if internal:
                lines.append(f"   :exclude-members: {', '.join(internal)}")
                lines += ['', '   Internals of the package, not part of the '
                          'user API: ' + ', '.join(f'``{m}``'
                                                  for m in internal) + '.']
        elif callable(obj):
            lines = [f'.. autofunction:: {name}']
        else:
            lines = [f'.. autodata:: {name}']
            annotation = _value_annotation(obj)
            if annotation is not None:
                lines += ['   :no-value:', f'   :annotation: {annotation}']
        return lines + ['']


def _words(text: str) -> List[str]:
    return text.split()


def drop_type_docstring(app: Sphinx, what: str, name: str, obj: Any,
                        options: Any, lines: List[str]) -> None:
    """A constant without a doc comment of its own gets no docstring, not
    its type's (autodoc's fallback: "dict() -> new empty dictionary")."""
    if what in ('data', 'attribute') and not inspect.isclass(obj) and \
            _words(' '.join(lines)) == _words(type(obj).__doc__ or ''):
        lines.clear()


# References by another public path ##########################################


def _lookup(dotted: str, namespace: Optional[Dict[str, Any]] = None) -> Any:
    """The object ``dotted`` names: an importable path, or a path that
    starts with a name of ``namespace``. ``None`` when there is none."""
    head, *rest = dotted.split('.')
    if namespace is not None and head in namespace:
        obj = namespace[head]
    else:
        obj, rest = None, dotted.split('.')
        for i in range(len(rest), 0, -1):
            try:
                obj = importlib.import_module('.'.join(rest[:i]))
            except ImportError:
                continue
            rest = rest[i:]
            break
        if obj is None:
            return None
    for attr in rest:
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            return None
    return obj


# id(object) -> its documented name; built on the first reference that
# needs it once all documents are read, dropped when a build reads them anew.
# (Not kept in the environment: ids do not outlive the process.)
_DOCUMENTED: Dict[int, str] = {}


def _documented(env: BuildEnvironment) -> Dict[int, str]:
    """id(object) -> its documented name, for the documented modules,
    classes, functions and methods of pyg_sar."""
    if not _DOCUMENTED:
        domain = env.get_domain('py')
        for name, entry in domain.objects.items():
            if not name.startswith('pyg_sar') or entry.aliased:
                continue
            obj = _lookup(name)
            if inspect.ismodule(obj) or inspect.isclass(obj) or \
                    inspect.isroutine(obj):
                _DOCUMENTED.setdefault(id(obj), name)
    return _DOCUMENTED


def _context_namespace(node: pending_xref) -> Optional[Dict[str, Any]]:
    """The globals of the module that defines the object whose docstring
    holds ``node`` (a module docstring: the module itself)."""
    module_name = node.get('py:module')
    if not module_name:
        return None
    context = _lookup(module_name)
    if node.get('py:class'):
        context = _lookup(f"{module_name}.{node['py:class']}")
        context = inspect.getmodule(context)
    return vars(context) if inspect.ismodule(context) else None


def _by_short_name(env: BuildEnvironment, target: str) -> Optional[str]:
    """The one documented pyg_sar object whose name ends with ``target``
    (``CommConfig``, ``DistGraph.reverse``), or ``None``."""
    domain = env.get_domain('py')
    found = [name for name, entry in domain.objects.items()
             if name.startswith('pyg_sar.') and not entry.aliased
             and name.endswith('.' + target)]
    return found[0] if len(found) == 1 else None


# Roles whose bare target may be looked up by its short name when the
# docstring's own module does not know it (an autosummary line shown on
# another module's page). Not methods and attributes: ``:meth:`update```
# means the class's own, undocumented, method.
_SHORT_NAME_ROLES = ('class', 'exc', 'func', 'data', 'mod', 'obj')


def resolve_alias(app: Sphinx, env: BuildEnvironment, node: pending_xref,
                  contnode: nodes.TextElement) -> Optional[nodes.Element]:
    if node.get('refdomain') != 'py':
        return None
    target = node['reftarget'].lstrip('.~')
    obj = _lookup(target) if target.startswith('pyg_sar') else None
    if obj is None:
        namespace = _context_namespace(node)
        if namespace is not None:
            obj = _lookup(target, namespace)
    if obj is not None:
        documented = _documented(env).get(id(obj))
    elif node.get('reftype') in _SHORT_NAME_ROLES:
        documented = _by_short_name(env, target)
    else:
        documented = None
    if documented is None or documented == target:
        return None
    domain = env.get_domain('py')
    return domain.resolve_xref(env, node['refdoc'], app.builder, 'obj',
                               documented, node, contnode)


def _forget_documented(app: Sphinx, env: BuildEnvironment) -> None:
    _DOCUMENTED.clear()


def setup(app: Sphinx) -> Dict[str, Any]:
    app.setup_extension('sphinx.ext.autodoc')
    app.setup_extension('sphinx.ext.autosummary')
    app.add_directive('pyg-sar-api', ApiDirective)
    app.connect('autodoc-process-docstring', drop_type_docstring)
    app.connect('env-updated', _forget_documented)
    app.connect('missing-reference', resolve_alias)
    return {'version': '1.0', 'parallel_read_safe': True,
            'parallel_write_safe': True}
