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


async def settled(namespace: dict[str, Any], timeout: float) -> None:
    """Until every ScheduledPipeline of the sample has a run that ended and no job due now
    of a kind the sample's workers handle waits or runs (or ``timeout``): a loaded machine
    may need more than ``SAMPLE_STOP_AFTER`` for them, and a sample that waits for its
    job's end must not have its worker stopped first."""
    import asyncpg

    ids = [value.pipeline_id for value in namespace.values() if type(value).__name__ == "ScheduledPipeline"]
    workers = [value for value in namespace.values() if type(value).__name__ == "Worker"]
    workers += [value.job_worker for value in namespace.values()
                if type(value).__name__ == "WorkerPool" and getattr(value, "job_worker", None) is not None]
    kinds = sorted({kind for worker in workers for kind in worker.handlers})
    url = os.environ.get("AGORA_PG_DATABASE_URL")
    if not (ids or kinds) or not url:
        return
    connection = await asyncpg.connect(url)
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline and await connection.fetchval(
            "SELECT (SELECT count(DISTINCT pipeline_id) FROM agora.runs WHERE pipeline_id = ANY($1::text[]) "
            "        AND finished_at IS NOT NULL) < $3 "
            "    OR EXISTS (SELECT FROM agora.jobs WHERE kind = ANY($2::text[]) AND run_at <= now() "
            "               AND status IN ('pending', 'processing'))", ids, kinds, len(ids)):
            await asyncio.sleep(0.2)
    finally:
        await connection.close()


async def run_until_stopped(coroutine: Any, namespace: dict[str, Any]) -> None:
    task = asyncio.ensure_future(coroutine)
    done, _ = await asyncio.wait([task], timeout=float(os.environ.get("SAMPLE_STOP_AFTER", "3")))
    if not done:
        await settled(namespace, 30.0)
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
