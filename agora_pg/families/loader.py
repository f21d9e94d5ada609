"""Loading a job family: its graph spec (``pipeline.yaml``), its runtime spec
(``resources/pipeline.yaml``) and its patterns (``resources/patterns/*.yaml``),
checked against its ``abc.py`` (the ports) and ``impl.py`` (the stages), then wired
with the services of the composition root into a ``FamilyPipeline``.

The runtime spec says which class of ``impl.py`` runs each node, per variant:

.. code-block:: yaml

    default_variant: email      # a job without payload["variant"] runs this one
    stages:                     # node -> its stage (every variant)
      load: LoadFromService
      compose: ComposeFromPattern
      deliver: DeliverByEmail
    variants:                   # variant -> the nodes it runs with another stage
      email: {}
      sms:
        deliver: DeliverBySms

A stage is built with its ``__init__``'s parameters taken by name from the services,
``patterns`` (the family's ``Patterns``) and ``variant``. Everything but the services
is checked when the family is first read; a mistake is a ``FamilySpecError`` naming
the file and the line.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from agora_pg.families.graph import FamilyGraph, read_graph
from agora_pg.families.patterns import Patterns
from agora_pg.families.spec_files import FamilySpecError, read_yaml, require_mapping, require_text

RUNTIME_KEYS = ("default_variant", "stages", "variants")
BUILT_IN = ("patterns", "variant")  # what a stage may ask for besides the services


@dataclasses.dataclass(frozen=True)
class Stage:
    """The class that runs a node in a variant, and where the runtime spec says so."""

    node: str
    cls: type
    line: int


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    """A family as read and checked (once per process: ``read_family``)."""

    package: str
    graph: FamilyGraph
    steps: dict[str, str]  # node -> the name of its port's one method
    variants: dict[str, dict[str, Stage]]  # variant -> node -> stage
    default_variant: str
    patterns: Patterns
    runtime_path: Path


class FamilyPipeline:
    """A family wired for one variant: ``await pipeline.run(*arguments)`` runs each node's
    step in the graph's order (roots get the arguments, other nodes the results of the
    nodes with an edge into them) and returns the last node's result."""

    def __init__(self, spec: FamilySpec, variant: str, stages: dict[str, Any]) -> None:
        self.spec = spec
        self.variant = variant
        self.stages = stages  # node -> its stage object
        self._steps = {node: getattr(stage, spec.steps[node]) for node, stage in stages.items()}

    async def run(self, *arguments: Any) -> Any:
        graph = self.spec.graph
        results: dict[str, Any] = {}
        for node in graph.order:
            inputs = arguments if node in graph.roots else tuple(results[source] for source in graph.inputs[node])
            try:
                result = self._steps[node](*inputs)
                results[node] = await result if inspect.isawaitable(result) else result
            except Exception as error:
                error.add_note(f"in stage {node} ({type(self.stages[node]).__name__}) of {self.spec.package}")
                raise
        return results[graph.end]


def load_family(package: str, services: Any, variant: str | None = None) -> FamilyPipeline:
    """Family ``package`` (``"families.appointment_reminder"``) wired with ``services`` (a
    mapping, or an object whose attributes are the services), in ``variant`` (the
    runtime spec's default when None)."""
    spec = read_family(package)
    chosen = spec.default_variant if variant is None else variant
    if chosen not in spec.variants:
        raise FamilySpecError(spec.runtime_path, None, f"no variant {chosen!r} (the variants: "
                                                       f"{', '.join(spec.variants)})")
    names = _service_names(services)
    stages = {node: _build(spec, stage, services, names, chosen) for node, stage in spec.variants[chosen].items()}
    return FamilyPipeline(spec, chosen, stages)


@functools.cache
def read_family(package: str) -> FamilySpec:
    """Read and check family ``package`` (cached: its files are read once per process)."""
    module = importlib.import_module(package)
    if module.__file__ is None:
        raise FamilySpecError(package, None, "a family is a package with an __init__.py")
    directory = Path(module.__file__).parent
    graph = read_graph(directory / "pipeline.yaml")
    ports = importlib.import_module(f"{package}.abc")
    impl = importlib.import_module(f"{package}.impl")
    steps = {node: _step(graph, node, _port(graph, node, ports)) for node in graph.ports}
    runtime_path = directory / "resources" / "pipeline.yaml"
    variants, default = _read_runtime(runtime_path, graph, ports, impl)
    return FamilySpec(package, graph, steps, variants, default, Patterns.read(directory / "resources" / "patterns"),
                      runtime_path)


def default_variant(package: str) -> str:
    """The variant of family ``package`` that a job without ``payload["variant"]`` runs."""
    return read_family(package).default_variant


def _port(graph: FamilyGraph, node: str, ports: ModuleType) -> type:
    name = graph.ports[node]
    port = getattr(ports, name, None)
    if not isinstance(port, type):
        raise FamilySpecError(graph.path, graph.lines[node], f"node {node!r}: no port {name} in {ports.__file__}")
    return port


def _step(graph: FamilyGraph, node: str, port: type) -> str:
    """The one abstract method of ``port``: the step each stage of the node implements."""
    methods = sorted(getattr(port, "__abstractmethods__", ()))
    if len(methods) != 1:
        raise FamilySpecError(graph.path, graph.lines[node], f"node {node!r}: port {port.__name__} must declare "
                                                             f"exactly one @abstractmethod (the stage's step), "
                                                             f"it has {len(methods)}")
    return str(methods[0])


def _read_runtime(
    path: Path, graph: FamilyGraph, ports: ModuleType, impl: ModuleType,
) -> tuple[dict[str, dict[str, Stage]], str]:
    spec = require_mapping(path, read_yaml(path), "the runtime spec", None)
    for key in spec:
        if key not in RUNTIME_KEYS:
            raise FamilySpecError(path, spec.lines[key], f"unknown key {key!r} (a runtime spec has "
                                                         f"{', '.join(RUNTIME_KEYS)})")
    if "stages" not in spec:
        raise FamilySpecError(path, spec.line, "no stages: say which class of impl.py runs each node, "
                                               "`stages: {node: ClassName}`")
    base = _stages(path, spec["stages"], spec.lines["stages"], graph, ports, impl, "stages")
    for node in graph.ports:
        if node not in base:
            raise FamilySpecError(path, spec.lines["stages"], f"node {node!r} (port {graph.ports[node]}) has no "
                                                              f"implementation: add `{node}: ClassName` under stages")
    variants: dict[str, dict[str, Stage]] = {}
    declared = spec.get("variants")
    if declared is None:
        variants["default"] = base
    else:
        declared = require_mapping(path, declared, "variants", spec.lines["variants"])
        for name, overrides in declared.items():
            line = declared.lines[name]
            changed = {} if overrides is None else _stages(path, overrides, line, graph, ports, impl,
                                                           f"variant {name!r}")
            variants[require_text(path, name, "a variant's name", line)] = {**base, **changed}
        if not variants:
            raise FamilySpecError(path, spec.lines["variants"], "variants is empty (leave it out for one variant)")
    default = spec.get("default_variant", next(iter(variants)))
    if default not in variants:
        raise FamilySpecError(path, spec.lines.get("default_variant"), f"default_variant {default!r} is not a "
                                                                       f"variant ({', '.join(variants)})")
    return variants, default


def _stages(
    path: Path, value: Any, line: int, graph: FamilyGraph, ports: ModuleType, impl: ModuleType, what: str,
) -> dict[str, Stage]:
    mapping = require_mapping(path, value, what, line)
    stages = {}
    for node, class_name in mapping.items():
        node_line = mapping.lines.get(node, line)
        if node not in graph.ports:
            raise FamilySpecError(path, node_line, f"{what}: unknown node {node!r} (the nodes of {graph.path.name}: "
                                                   f"{', '.join(graph.ports)})")
        name = require_text(path, class_name, f"the stage of node {node!r}", node_line)
        cls = getattr(impl, name, None)
        if not isinstance(cls, type):
            raise FamilySpecError(path, node_line, f"node {node!r}: no class {name} in {impl.__file__}")
        port = _port(graph, node, ports)
        if not issubclass(cls, port):
            raise FamilySpecError(path, node_line, f"node {node!r}: {name} does not implement port {port.__name__} "
                                                   f"(write class {name}({port.__name__}))")
        if inspect.isabstract(cls):
            missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
            raise FamilySpecError(path, node_line, f"node {node!r}: {name} leaves {missing} of {port.__name__} "
                                                   f"unimplemented")
        stages[node] = Stage(node, cls, node_line)
    return stages


def _build(spec: FamilySpec, stage: Stage, services: Any, names: set[str], variant: str) -> Any:
    """``stage.cls(...)``, each parameter of its ``__init__`` taken by name (from the
    services, whose ``names`` these are, ``patterns`` and ``variant``)."""
    given = {"patterns": spec.patterns, "variant": variant}
    arguments = {}
    for parameter in list(inspect.signature(stage.cls).parameters.values()):
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.name in given:
            arguments[parameter.name] = given[parameter.name]
        elif parameter.name in names:
            arguments[parameter.name] = services[parameter.name] if isinstance(services, Mapping) else getattr(
                services, parameter.name)
        elif parameter.default is parameter.empty:
            raise FamilySpecError(spec.runtime_path, stage.line, f"node {stage.node!r}: {stage.cls.__name__} needs "
                                                                 f"{parameter.name!r}, which is no service (the "
                                                                 f"services: {', '.join(sorted(names)) or 'none'}; "
                                                                 f"also given: {', '.join(BUILT_IN)})")
    return stage.cls(**arguments)


def _service_names(services: Any) -> set[str]:
    if services is None:
        return set()
    if isinstance(services, Mapping):
        return set(services)
    if dataclasses.is_dataclass(services):
        return {field.name for field in dataclasses.fields(services)}
    return {name for name in dir(services) if not name.startswith("_")}
