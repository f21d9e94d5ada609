"""Loading a family of this project: ``load(package, services, variant)`` reads its
graph spec, runtime spec and patterns (once per process), checks them against its
``abc.py`` and ``impl.py``, and wires its stages with the services of the composition
root (``init.init()``), the family's ``patterns`` and the ``variant``."""

from __future__ import annotations

from agora_pg.families import FamilyPipeline, default_variant, load_family

load = load_family

__all__ = ["FamilyPipeline", "default_variant", "load"]
