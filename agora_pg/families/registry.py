"""Job families by ``kind`` and ``variant``, as in the seed's ``register(kind, variant,
root_cls)``: the worker's handler of a kind runs the variant a job names.

``register`` takes either a handler ``(job, resources)`` or a root class, which is
built as ``root_cls(resources)`` for each job (the resources: the composition root's
services) and run as ``await root.run(job.payload)``. A job picks its variant with
``payload["variant"]``; without one it runs the kind's default: the variant registered
with ``default=True``, else the first registered.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from agora_pg.errors import Fail
from agora_pg.jobs import Job

class UnknownVariant(Fail, LookupError):
    """A job asked for a variant its family does not have (the job fails at once: a
    retry would ask again)."""


class FamilyRegistry:
    """Kinds -> variants -> handler or root class."""

    def __init__(self) -> None:
        self._families: dict[str, dict[str, Any]] = {}
        self._defaults: dict[str, str] = {}

    def register(self, kind: str, variant: str, handler_or_root: Any, *, default: bool = False) -> FamilyRegistry:
        """Run ``handler_or_root`` for the jobs of ``kind`` that ask for ``variant`` (and for
        those that ask for none when ``default`` or when it is the kind's first)."""
        if not isinstance(kind, str) or not kind or not isinstance(variant, str) or not variant:
            raise ValueError("kind and variant must be non-empty strings")
        if not callable(handler_or_root):
            raise TypeError(f"register({kind!r}, {variant!r}, ...) needs a handler or a root class")
        variants = self._families.setdefault(kind, {})
        if variant in variants:
            raise ValueError(f"{kind}/{variant} is registered already")
        variants[variant] = handler_or_root
        if default or kind not in self._defaults:
            self._defaults[kind] = variant
        return self

    def variants(self, kind: str) -> list[str]:
        return sorted(self._families.get(kind, {}))

    def handlers(self) -> dict[str, Callable[[Job, Any], Any]]:
        """One worker handler per kind, dispatching on the job's variant."""
        return {kind: self._dispatcher(kind) for kind in self._families}

    def _dispatcher(self, kind: str) -> Callable[[Job, Any], Any]:
        variants = self._families[kind]

        async def handle(job: Job, resources: Any) -> Any:
            variant = job.payload.get("variant", self._defaults[kind])
            target: Any = variants.get(variant) if isinstance(variant, str) else None
            if target is None:
                raise UnknownVariant(f"{kind} has no variant {variant!r} (it has {', '.join(sorted(variants))})")
            if isinstance(target, type):
                result = target(resources).run(job.payload)
            else:
                result = target(job, resources)
            return await result if inspect.isawaitable(result) else result

        handle.__name__ = f"{kind}_family"
        return handle
