"""Run one sample of the README or the docs (a file) as a user would paste it: top-level ``await`` runs as
in ``python -m asyncio``. A sample that blocks until stopped (``start()``, ``run()``)
is stopped after ``SAMPLE_STOP_AFTER`` seconds as SIGTERM would stop it. A module
sample that defines ``get_worker()`` has it called: it must build a Worker or WorkerPool."""

from __future__ import annotations

import ast
import asyncio
import os
import sys
import types
from typing import Any

STOPPABLE = ("ScheduledPipeline", "WorkerPool", "Worker")


async def run_until_stopped(coroutine: Any, namespace: dict[str, Any]) -> None:
    task = asyncio.ensure_future(coroutine)
    done, _ = await asyncio.wait([task], timeout=float(os.environ.get("SAMPLE_STOP_AFTER", "3")))
    if not done:
        for value in list(namespace.values()):
            if type(value).__name__ in STOPPABLE:
                value.stop()
    await asyncio.wait_for(task, 60)


def main(path: str) -> None:
    source = open(path, encoding="utf-8").read()
    module = types.ModuleType("doc_sample")  # a module of its own, as a pasted file would be
    sys.modules[module.__name__] = module
    namespace: dict[str, Any] = module.__dict__
    code = compile(source, path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if code.co_flags & 0x80:  # CO_COROUTINE: the sample awaits at top level
        asyncio.run(run_until_stopped(eval(code, namespace), namespace))  # noqa: S307 - the docs' own code
    else:
        exec(code, namespace)  # noqa: S102
    if "get_worker" in namespace:
        built = namespace["get_worker"]()
        assert type(built).__name__ in ("Worker", "WorkerPool"), built
        print(f"get_worker() -> {type(built).__name__}")


if __name__ == "__main__":
    main(sys.argv[1])
