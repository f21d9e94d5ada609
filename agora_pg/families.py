"""Job families: handlers registered by ``kind`` and ``variant``, as in the seed's
``register(kind, variant, root_cls)``.

A family is a small pipeline of stages (load, compose, deliver, ...) behind one
root. ``register`` takes either a handler ``(job, resources)`` or a root class,
which is built as ``root_cls(resources)`` for each job and run as
``await root.run(job.payload)``. A job picks its variant with ``payload["variant"]``
(``"default"`` when absent).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from agora_pg.jobs import Job

DEFAULT_VARIANT = "default"


class UnknownVariant(LookupError):
    """A job asked for a variant its family does not have."""


class FamilyRegistry:
    """Kinds -> variants -> handler or root class."""

    def __init__(self) -> None:
        self._families: dict[str, dict[str, Any]] = {}

    def register(self, kind: str, variant: str, handler_or_root: Any) -> FamilyRegistry:
        if not isinstance(kind, str) or not kind or not isinstance(variant, str) or not variant:
            raise ValueError("kind and variant must be non-empty strings")
        if not callable(handler_or_root):
            raise TypeError(f"register({kind!r}, {variant!r}, ...) needs a handler or a root class")
        variants = self._families.setdefault(kind, {})
        if variant in variants:
            raise ValueError(f"{kind}/{variant} is registered already")
        variants[variant] = handler_or_root
        return self

    def variants(self, kind: str) -> list[str]:
        return sorted(self._families.get(kind, {}))

    def handlers(self) -> dict[str, Callable[[Job, Any], Any]]:
        """One worker handler per kind, dispatching on the job's variant."""
        return {kind: self._dispatcher(kind) for kind in self._families}

    def _dispatcher(self, kind: str) -> Callable[[Job, Any], Any]:
        variants = self._families[kind]

        async def handle(job: Job, resources: Any) -> Any:
            variant = job.payload.get("variant", DEFAULT_VARIANT)
            target: Any = variants.get(variant)
            if target is None:
                raise UnknownVariant(f"{kind} has no variant {variant!r} (it has {', '.join(sorted(variants))})")
            if isinstance(target, type):
                result = target(resources).run(job.payload)
            else:
                result = target(job, resources)
            return await result if inspect.isawaitable(result) else result

        handle.__name__ = f"{kind}_family"
        return handle
