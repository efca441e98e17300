"""YAML of job files and `--set` values, read defensively: JSON values only, bounded work.

A job's values travel as JSON (hyperparameters, the CreateTrainingJob request, job.json), so
what JSON cannot hold is refused where it is written, with its line: YAML dates, `!!binary`,
`!!set`, `!!omap`, keys that are not text (`on:` is the boolean true in YAML 1.1), strings
with NUL or lone surrogates (no file name, variable or argument can carry them). So is what
only an accident or an attack produces: duplicate keys (YAML keeps the last one silently),
nesting deeper than any job needs, and aliases that expand into more nodes than a job file
has (a "billion laughs" expands a few lines into gigabytes of hyperparameters).

libyaml scans and parses (PyYAML's binding, which its wheels carry: a job file read ~4.6x faster
than by PyYAML's Python scanner), and the composing and constructing, where those limits are
checked, are PyYAML's Python ones over libyaml's events. PyYAML built without libyaml reads with
its Python scanner (libyaml refuses a few forms it accepts, such as `[a, b:]`).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, SequenceNode
from yaml.resolver import Resolver

try:
    from yaml._yaml import CParser as _Parser
except ImportError:  # PyYAML without libyaml
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Parser(Reader, Scanner, Parser):  # what yaml.SafeLoader reads with
        def __init__(self, stream: str):
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)

MAX_DEPTH = 32  # a job nests about 6 levels (distribution.smdistributed.modelparallel.parameters.x)
MAX_NODES = 20_000  # scalars, lists and mappings after alias expansion; a job file has a few hundred
MERGE_TAG = "tag:yaml.org,2002:merge"

_NOT_JSON = {
    "timestamp": ("a YAML date", "quote it to keep it as text, e.g. '2024-01-31'"),
    "binary": ("!!binary data", "give the value as text (e.g. a quoted base64 string)"),
    "set": ("a YAML !!set", "use a list: [a, b]"),
    "omap": ("a YAML !!omap", "use a mapping: {a: 1, b: 2}"),
    "pairs": ("a YAML !!pairs", "use a mapping: {a: 1, b: 2}"),
}


# libyaml's problems whose fix is more than the syntax's
_FIXES = {"found invalid Unicode character escape code": "a \\uD800-\\uDFFF escape is half a character (a lone "
                                                         "surrogate), and none is above \\U0010FFFF: escape whole "
                                                         "characters"}


class YamlProblem(ValueError):
    """Text that is not a job's YAML: what is wrong (with its line), and the fix."""

    def __init__(self, problem: str, fix: str, mark: Any = None):
        self.fix = fix
        self.line = mark.line + 1 if mark is not None else None
        where = f" at line {self.line}, column {mark.column + 1}" if mark is not None else ""
        self.problem = f"{problem}{where}"
        super().__init__(self.problem)


def loads(text: str) -> Any:
    """The one YAML document in `text`, as JSON values; YamlProblem for anything else."""
    try:
        return yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader: no Python objects
    except YamlProblem:
        raise
    except yaml.MarkedYAMLError as exc:
        problem = exc.problem or exc.context or "not valid YAML"
        if problem == "exceeded maximum nesting depth":  # libyaml's own bound (1,000), met as it reads ahead
            _check_bounds(MAX_DEPTH + 1, 0, exc.problem_mark)
        raise YamlProblem(f"invalid YAML: {problem}", _FIXES.get(problem, "fix the YAML syntax"),
                          exc.problem_mark) from None
    except yaml.YAMLError as exc:  # the reader's own errors (control characters) carry no mark
        raise YamlProblem(f"invalid YAML: {exc}", "remove the control characters") from None
    except UnicodeEncodeError as exc:  # libyaml reads UTF-8, which a lone surrogate has no bytes in
        raise _lone_surrogate(_Mark(text, exc.start)) from None


class _Loader(Composer, _Parser, SafeConstructor, Resolver):
    """yaml.SafeLoader's parts (no Python objects), on libyaml's parser, with the limits above."""

    def __init__(self, stream: str):
        _Parser.__init__(self, stream)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):  # an alias adds no node here: _check_expansion counts it
            return super().compose_node(parent, index)
        self._depth += 1
        self._nodes += 1
        mark = self.peek_event().start_mark
        _check_bounds(self._depth, self._nodes, mark)  # before recursing: deep input cannot exhaust the stack
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):
        node = super().compose_document()
        _check_expansion(node)
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, MappingNode):
            first_line: dict[str, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:  # `<<: *base` then a key of base: an override, not a duplicate
                    continue
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, str):
                    raise YamlProblem(f"the key {key!r} is a {type(key).__name__}, not text",
                                      "quote it, e.g. 'on': or '1':", key_node.start_mark)
                if key in first_line:
                    raise YamlProblem(f"duplicate key {key!r} (first at line {first_line[key]})",
                                      "keep one of them: YAML would silently use the last",
                                      key_node.start_mark)
                first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)

    def construct_yaml_str(self, node):
        value = self.construct_scalar(node)
        if "\0" in value:
            raise YamlProblem("the text contains a NUL character (\\0)", "remove it", node.start_mark)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _lone_surrogate(node.start_mark) from None
        return value

    def construct_yaml_int(self, node):
        try:
            return super().construct_yaml_int(node)
        except ValueError as exc:  # Python refuses to convert integers of more than 4,300 digits
            raise YamlProblem(f"the integer cannot be read ({exc})", "use a smaller number",
                              node.start_mark) from None


def _lone_surrogate(mark: Any) -> YamlProblem:
    return YamlProblem("the text contains a lone surrogate (\\uD800-\\uDFFF), which UTF-8 cannot hold",
                       "remove it or write the whole character", mark)


class _Mark:
    """The line and column of `text`'s character `index`, as a parser's mark gives them."""

    def __init__(self, text: str, index: int):
        self.line = text.count("\n", 0, index)
        self.column = index - (text.rfind("\n", 0, index) + 1)


def _refuse(kind: str):
    what, fix = _NOT_JSON[kind]

    def construct(loader: _Loader, node) -> Any:
        raise YamlProblem(f"{what} is not a JSON value", fix, node.start_mark)

    return construct


_Loader.add_constructor("tag:yaml.org,2002:str", _Loader.construct_yaml_str)
_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
for _kind in _NOT_JSON:
    _Loader.add_constructor(f"tag:yaml.org,2002:{_kind}", _refuse(_kind))


def _check_bounds(depth: int, nodes: int, mark: Any) -> None:
    if depth > MAX_DEPTH:
        raise YamlProblem(f"nested more than {MAX_DEPTH} levels deep", "flatten the structure", mark)
    if nodes > MAX_NODES:
        raise YamlProblem(f"more than {MAX_NODES:,} values (aliases counted as often as they are used)",
                          "a job file is small: remove the bulk, or aliases that repeat large blocks", mark)


def _check_expansion(root: Any) -> None:
    """Bound the document as its aliases expand it: depth, node count, and no alias inside its own anchor."""
    done: dict[int, tuple[int, int]] = {}  # id(node) -> (nodes when expanded, height)
    open_: set[int] = set()

    def walk(node: Any, depth: int) -> tuple[int, int]:
        key = id(node)
        if key not in done:
            if key in open_:
                raise YamlProblem("an alias refers to the anchor that contains it",
                                  "a job file cannot be recursive: copy the value instead", node.start_mark)
            _check_bounds(depth, 0, node.start_mark)
            open_.add(key)
            size, height = 1, 0
            for child in _children(node):
                child_size, child_height = walk(child, depth + 1)
                size, height = size + child_size, max(height, child_height + 1)
                _check_bounds(0, size, node.start_mark)
            open_.discard(key)
            done[key] = (size, height)
        size, height = done[key]
        _check_bounds(depth + height, 0, node.start_mark)
        return size, height

    if root is not None:
        walk(root, 1)


def _children(node: Any) -> list[Any]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []
