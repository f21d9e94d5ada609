"""Job families, as the jobs document lays them out: a family is a small graph of
stages behind ports (``abc.py``), implemented in ``impl.py``, described by a graph
spec (``pipeline.yaml``) and a runtime spec with message patterns (``resources/``),
wired by ``load_family`` with the services of the composition root, and registered
for the worker by ``register(kind, variant, root_cls)``. ``agora-pg family new NAME``
writes a new one from the template.
"""

from agora_pg.families.loader import FamilyPipeline, FamilySpec, default_variant, load_family, read_family
from agora_pg.families.patterns import MissingTemplateVariable, Patterns, UnknownPattern
from agora_pg.families.registry import FamilyRegistry, UnknownVariant
from agora_pg.families.spec_files import FamilySpecError

__all__ = [
    "FamilyPipeline", "FamilyRegistry", "FamilySpec", "FamilySpecError", "MissingTemplateVariable", "Patterns",
    "UnknownPattern", "UnknownVariant", "default_variant", "load_family", "read_family",
]
