"""Loading a family: the graph spec, the runtime spec and the patterns are checked when
read, and each mistake is one error naming the file and the line."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from agora_pg.families import FamilySpecError, MissingTemplateVariable, Patterns, UnknownPattern, load_family

ABC = '''
from abc import ABC, abstractmethod

class FetchPort(ABC):
    @abstractmethod
    async def fetch(self, n): ...

class DoublePort(ABC):
    @abstractmethod
    def double(self, n): ...

class SumPort(ABC):
    @abstractmethod
    def total(self, a, b): ...

class TwoSteps(ABC):
    @abstractmethod
    def one(self): ...
    @abstractmethod
    def two(self): ...
'''

IMPL = '''
from .abc import DoublePort, FetchPort, SumPort

class Fetch(FetchPort):
    def __init__(self, numbers):
        self.numbers = numbers
    async def fetch(self, n):
        return self.numbers[n]

class Double(DoublePort):
    def __init__(self, variant, factor=2):
        self.factor = 3 if variant == "triple" else factor
    def double(self, n):
        return n * self.factor

class Sum(SumPort):
    def total(self, a, b):
        return f"{a}+{b}"

class Half(DoublePort):
    pass

class NotAPort:
    def double(self, n):
        return n
'''

GRAPH = '''
nodes:
  fetch: FetchPort
  double: DoublePort
  total: SumPort
edges:
  - fetch -> double
  - fetch -> total
  - double -> total
roots: [fetch]
'''

RUNTIME = '''
default_variant: double
stages:
  fetch: Fetch
  double: Double
  total: Sum
variants:
  double: {}
  triple:
'''


def family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, graph: str = GRAPH, runtime: str = RUNTIME,
           patterns: dict[str, str] | None = None) -> str:
    """A family package written under ``tmp_path`` (a new name each time: read_family caches)."""
    name = f"family_{uuid.uuid4().hex[:8]}"
    root = tmp_path / name
    (root / "resources" / "patterns").mkdir(parents=True)
    files = {"__init__.py": "", "abc.py": ABC, "impl.py": IMPL, "pipeline.yaml": graph,
             "resources/pipeline.yaml": runtime}
    files.update({f"resources/patterns/{stem}.yaml": text for stem, text in (patterns or {}).items()})
    for relative, text in files.items():
        (root / relative).write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


async def test_a_graph_with_fan_in_runs_in_order_in_each_variant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = family(tmp_path, monkeypatch)
    assert await load_family(package, {"numbers": {1: 5}}).run(1) == "5+10"  # total(fetch, double): edge order
    assert await load_family(package, {"numbers": {1: 5}}, "triple").run(1) == "5+15"
    with pytest.raises(FamilySpecError, match="no variant 'quadruple' \\(the variants: double, triple\\)"):
        load_family(package, {"numbers": {}}, "quadruple")


async def test_a_stage_needing_a_service_that_is_not_there_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    package = family(tmp_path, monkeypatch)
    with pytest.raises(FamilySpecError, match=r"resources/pipeline.yaml, line 3: node 'fetch': Fetch needs "
                                              r"'numbers', which is no service \(the services: other"):
        load_family(package, {"other": 1})


@pytest.mark.parametrize(("graph", "line", "message"), [
    (GRAPH.replace("fetch -> total", "fetch -> totl"), 7, "edge 'fetch -> totl': unknown node 'totl' "
                                                          "\\(the nodes: fetch, double, total\\)"),
    (GRAPH.replace("roots: [fetch]", "roots: [fetch]\nextra: 1"), 10, "unknown key 'extra'"),
    (GRAPH.replace("  - double -> total\n", "  - double -> total\n  - total -> fetch\n"), 9,
     "edge 'total -> fetch' closes a cycle: fetch -> double -> total -> fetch"),
    (GRAPH.replace("fetch -> total", "total -> double"), 7, "edge 'total -> double' closes a cycle: "
                                                            "double -> total -> double"),
    (GRAPH.replace("fetch -> double", "double -> double"), 6, "edge 'double -> double' is a cycle"),
    (GRAPH.replace("roots: [fetch]", "roots: [fetch, nobody]"), 9, "roots: unknown node 'nobody'"),
    (GRAPH.replace("  - fetch -> double\n", ""), 3, "node 'double' gets nothing"),
    (GRAPH.replace("  - double -> total\n", ""), None, "the graph must end in one node .* it ends in double, total"),
    (GRAPH.replace("double: DoublePort", "double: MissingPort"), 3, "node 'double': no port MissingPort in"),
    (GRAPH.replace("double: DoublePort", "double: TwoSteps"), 3, "node 'double': port TwoSteps must declare exactly "
                                                                 "one @abstractmethod"),
    (GRAPH.replace("  fetch: FetchPort", "  fetch: FetchPort\n  fetch: SumPort"), 3, "'fetch' appears twice "
                                                                                       "\\(first on line 2\\)"),
    (GRAPH.replace("roots: [fetch]", "roots: [fetch"), 10, "not YAML"),
])
def test_a_broken_graph_spec_names_its_file_line_and_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, graph: str, line: int | None, message: str,
) -> None:
    package = family(tmp_path, monkeypatch, graph=graph)
    where = f"pipeline.yaml, line {line}: " if line is not None else "pipeline.yaml, line \\d+: "
    with pytest.raises(FamilySpecError, match=f"{package}/{where}{message}"):
        load_family(package, {"numbers": {}})


@pytest.mark.parametrize(("runtime", "line", "message"), [
    (RUNTIME.replace("  total: Sum\n", ""), 2, "node 'total' \\(port SumPort\\) has no implementation"),
    (RUNTIME.replace("total: Sum", "total: Summer"), 5, "node 'total': no class Summer in"),
    (RUNTIME.replace("double: Double\n", "double: NotAPort\n"), 4, "node 'double': NotAPort does not implement port DoublePort "
                                                                    "\\(write class NotAPort\\(DoublePort\\)\\)"),
    (RUNTIME.replace("double: Double\n", "double: Half\n"), 4, "node 'double': Half leaves double of DoublePort unimplemented"),
    (RUNTIME.replace("triple:", "triple:\n    halve: Half"), 9, "variant 'triple': unknown node 'halve'"),
    (RUNTIME.replace("default_variant: double", "default_variant: single"), 1, "default_variant 'single' is not"),
])
def test_a_missing_port_implementation_names_its_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime: str, line: int, message: str,
) -> None:
    package = family(tmp_path, monkeypatch, runtime=runtime)
    with pytest.raises(FamilySpecError, match=f"{package}/resources/pipeline.yaml, line {line}: {message}"):
        load_family(package, {"numbers": {}})


def test_patterns_merge_from_every_file_and_render_only_with_every_value(tmp_path: Path) -> None:
    directory = tmp_path / "patterns"
    directory.mkdir()
    (directory / "greet.yaml").write_text('hello: "Hello {name}"\nformal:\n  bye: "Goodbye, {title} {name}."\n')
    (directory / "notice.yaml").write_text('short: "{what}: {{done}}"\n')
    patterns = Patterns.read(directory)
    assert patterns.keys() == ["greet.formal.bye", "greet.hello", "notice.short"]
    assert patterns.render("greet.formal.bye", title="Dr", name="Who") == "Goodbye, Dr Who."
    assert patterns.render("notice.short", what="build") == "build: {done}"
    with pytest.raises(MissingTemplateVariable, match=r"pattern greet.formal.bye \(.*greet.yaml, line 3\) needs a "
                                                      r"value for name, title: none was given"):
        patterns.render("greet.formal.bye", name=None)
    with pytest.raises(UnknownPattern, match="no pattern 'greet.bye'"):
        patterns.render("greet.bye")


@pytest.mark.parametrize(("text", "message"), [
    ('a: "x {0}"\n', r"line 1: pattern p.a: a field is a name and nothing else \({name}\), not {0}"),
    # more than the values given, or what a format spec would allocate: refused when read
    ('a: "x {recipient.__class__.__mro__}"\n', r"line 1: .*, not {recipient.__class__.__mro__}"),
    ('a: "x {recipient[0]}"\n', r"line 1: .*, not {recipient\[0\]}"),
    ('a: "x {x:>1000000000}"\n', r"line 1: .*, not {x:>1000000000}"),
    ('a: "x {x!r}"\n', r"line 1: .*, not {x!r}"),
    ('a: "x {name"\n', "line 1: pattern p.a: .* \\(write {{ and }} for braces\\)"),
    ("a: 3\n", "line 1: pattern p.a must be a text"),
    ('a: "x"\na: "y"\n', "line 2: 'a' appears twice"),
])
def test_a_broken_pattern_is_named_when_read(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "p.yaml").write_text(text)
    with pytest.raises(FamilySpecError, match=f"p.yaml, {message}"):
        Patterns.read(tmp_path)


def test_a_pattern_renders_its_values_as_text_and_reads_nothing_else(tmp_path: Path) -> None:
    class Recipient:
        secret = "not for a message"

        def __str__(self) -> str:
            return "Ada"

    (tmp_path / "p.yaml").write_text('a: "Dear {recipient}, {{braces}}"\n')
    assert Patterns.read(tmp_path).render("p.a", recipient=Recipient(), other="unused") == "Dear Ada, {braces}"


@pytest.mark.parametrize(("text", "message"), [
    ("a: &x [1]\nb: *x\n", "line 1: anchors and aliases"),  # (the first of a billion laughs' steps)
    ("- " * 60 + "x\n", "line 1: nested deeper than 50 levels"),
])
def test_a_family_file_is_refused_before_anything_is_built(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "p.yaml").write_text(text)
    with pytest.raises(FamilySpecError, match=f"p.yaml, {message}"):
        Patterns.read(tmp_path)


BOMBS = {
    "billion_laughs": "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + n)}: &{chr(98 + n)} [{', '.join(['*' + chr(97 + n)] * 10)}]\n" for n in range(9)),
    "ten_thousand_deep": "[" * 10_000 + "]" * 10_000 + "\n",
    "larger_than_a_megabyte": "a: " + "x" * 1_100_000 + "\n",
}


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_a_hostile_family_file_is_refused_within_a_memory_limit(tmp_path: Path, bomb: str) -> None:
    """In a process of its own limited to 256 MB of address space beyond what it starts
    with: the refusal comes before anything expands (the billion laughs would need
    gigabytes, the deep file a RecursionError)."""
    (tmp_path / "p.yaml").write_text(BOMBS[bomb])
    script = (
        "import resource, sys\n"
        "from pathlib import Path\n"
        "from agora_pg.families.patterns import Patterns\n"
        "from agora_pg.families.spec_files import FamilySpecError\n"
        "used = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
        "resource.setrlimit(resource.RLIMIT_AS, (used + 256 * 2**20, used + 256 * 2**20))\n"
        "try:\n"
        "    Patterns.read(Path(sys.argv[1]))\n"
        "except FamilySpecError as error:\n"
        "    print(error)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "p.yaml" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("name", ["demo_notice\n", "demo notice", "Demo", "class", "shared", ""])
def test_a_family_name_is_refused_unless_it_is_exactly_an_identifier(tmp_path: Path, name: str) -> None:
    from agora_pg.errors import ConfigError
    from agora_pg.families.scaffold import new_family

    with pytest.raises(ConfigError, match="is no family name"):
        new_family(name, tmp_path)
    assert not (tmp_path / "families").exists()
