"""A family's graph spec (``pipeline.yaml``): its stages (nodes, each behind a port of
the family's ``abc.py``), how results flow between them (edges) and where a run's
arguments go in (roots). Checked when read; pure (no I/O but reading the file).

.. code-block:: yaml

    nodes:               # node: the port (a class of abc.py) its stage implements
      load: LoadPort
      compose: ComposePort
      deliver: DeliverPort
    edges:               # "from -> to": to's step gets from's result
      - load -> compose
      - compose -> deliver
    roots: [load]        # these get the run's arguments

A node's step gets the results of the nodes with an edge into it, in the order of
those edges; the graph ends in one node, whose result is the run's.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from agora_pg.families.spec_files import FamilySpecError, Sequence, read_yaml, require_mapping, require_text

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
KEYS = ("nodes", "edges", "roots")


@dataclasses.dataclass(frozen=True)
class FamilyGraph:
    """A checked graph: acyclic, every node fed by a root or an edge, one end."""

    path: Path
    ports: dict[str, str]  # node -> the name of its port in abc.py
    lines: dict[str, int]  # node -> the line that declares it
    inputs: dict[str, tuple[str, ...]]  # node -> the nodes whose results it gets, in edge order
    roots: tuple[str, ...]
    order: tuple[str, ...]  # every node after the nodes it gets results from
    end: str  # the node whose result is the run's


def read_graph(path: Path) -> FamilyGraph:
    return parse_graph(path, read_yaml(path))


def parse_graph(path: Path, document: Any) -> FamilyGraph:
    spec = require_mapping(path, document, "the graph spec", None)
    for key in spec:
        if key not in KEYS:
            raise FamilySpecError(path, spec.lines[key], f"unknown key {key!r} (a graph has {', '.join(KEYS)})")
    if "nodes" not in spec:
        raise FamilySpecError(path, spec.line, "no nodes: list the stages as `nodes: {name: PortName}`")
    nodes = require_mapping(path, spec["nodes"], "nodes", spec.lines["nodes"])
    if not nodes:
        raise FamilySpecError(path, spec.lines["nodes"], "nodes is empty: a family has at least one stage")
    ports: dict[str, str] = {}
    for name, port in nodes.items():
        if not NAME.match(name):
            raise FamilySpecError(path, nodes.lines[name], f"node {name!r}: a name is letters, digits and _")
        ports[name] = require_text(path, port, f"node {name!r}'s port", nodes.lines[name])

    inputs: dict[str, list[str]] = {name: [] for name in ports}
    outputs: dict[str, list[tuple[str, int]]] = {name: [] for name in ports}
    for text, line in _items(path, spec, "edges"):
        source, target = _edge(path, text, line, ports)
        if source in inputs[target]:
            raise FamilySpecError(path, line, f"edge {text!r} appears twice")
        inputs[target].append(source)
        outputs[source].append((target, line))
    _refuse_cycles(path, outputs)

    root_items = _items(path, spec, "roots")
    roots = [_node(path, text, line, ports, "roots:") for text, line in root_items]
    if not roots:
        raise FamilySpecError(path, spec.line, "no roots: name the nodes that get the run's arguments, `roots: [...]`")
    for index, (root, (_, line)) in enumerate(zip(roots, root_items, strict=True)):
        if root in roots[:index]:
            raise FamilySpecError(path, line, f"root {root!r} appears twice")
        if inputs[root]:
            raise FamilySpecError(path, line, f"root {root!r} has an edge into it (from {', '.join(inputs[root])})")
    for name in ports:
        if not inputs[name] and name not in roots:
            raise FamilySpecError(path, nodes.lines[name],
                                  f"node {name!r} gets nothing: no edge goes into it and it is not a root")
    ends = [name for name in ports if not outputs[name]]
    if len(ends) != 1:
        raise FamilySpecError(path, spec.line, f"the graph must end in one node (whose result is the run's); "
                                               f"it ends in {', '.join(ends)}")
    return FamilyGraph(path, ports, dict(nodes.lines), {name: tuple(sources) for name, sources in inputs.items()},
                       tuple(roots), _order(ports, inputs), ends[0])


def _items(path: Path, spec: Any, key: str) -> list[tuple[str, int]]:
    """The texts of the list ``spec[key]`` (a single text counts as a list of one), with lines."""
    if key not in spec or spec[key] is None:
        return []
    value, line = spec[key], spec.lines[key]
    if isinstance(value, str):
        return [(value, line)]
    if not isinstance(value, Sequence):
        raise FamilySpecError(path, line, f"{key} must be a list")
    return [(require_text(path, item, f"an item of {key}", item_line), item_line)
            for item, item_line in zip(value, value.lines, strict=True)]


def _edge(path: Path, text: str, line: int, ports: dict[str, str]) -> tuple[str, str]:
    parts = [part.strip() for part in text.split("->")]
    if len(parts) != 2 or not all(parts):
        raise FamilySpecError(path, line, f"edge {text!r}: write an edge as `from -> to`")
    source, target = (_node(path, part, line, ports, f"edge {text!r}:") for part in parts)
    if source == target:
        raise FamilySpecError(path, line, f"edge {text!r} is a cycle: {source} -> {source}")
    return source, target


def _node(path: Path, name: str, line: int, ports: dict[str, str], what: str) -> str:
    if name not in ports:
        raise FamilySpecError(path, line, f"{what} unknown node {name!r} (the nodes: {', '.join(ports)})")
    return name


def _refuse_cycles(path: Path, outputs: dict[str, list[tuple[str, int]]]) -> None:
    """A depth-first walk: an edge back to a node on the current path closes a cycle."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    trail: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        trail.append(name)
        for target, line in outputs[name]:
            if state.get(target) == 1:
                cycle = trail[trail.index(target):] + [target]
                raise FamilySpecError(path, line, f"edge '{name} -> {target}' closes a cycle: {' -> '.join(cycle)}")
            if target not in state:
                visit(target)
        trail.pop()
        state[name] = 2

    for name in outputs:
        if name not in state:
            visit(name)


def _order(ports: dict[str, str], inputs: dict[str, list[str]]) -> tuple[str, ...]:
    """Every node after its inputs, otherwise in the order the spec declares them."""
    order: list[str] = []
    placed: set[str] = set()
    while len(order) < len(ports):
        for name in ports:
            if name not in placed and all(source in placed for source in inputs[name]):
                order.append(name)
                placed.add(name)
                break
    return tuple(order)
