"""The project's one family registry: each family's ``impl.py`` calls
``register(kind, variant, root_cls)`` when imported; ``worker.py`` imports the families
and takes ``FAMILIES.handlers()``."""

from __future__ import annotations

from agora_pg.families import FamilyRegistry

FAMILIES = FamilyRegistry()
register = FAMILIES.register
