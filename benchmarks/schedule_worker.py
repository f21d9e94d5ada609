"""BENCH_PIPELINES no-op pipelines on Schedule.every(seconds=1): `--module benchmarks.schedule_worker`."""

import os

from agora_pg.runner import Schedule, ScheduledPipeline, WorkerPool


class Noop:
    async def run(self) -> None:
        return None


async def build() -> Noop:
    return Noop()


def get_worker() -> WorkerPool:
    pool = WorkerPool()
    for index in range(int(os.environ.get("BENCH_PIPELINES", "200"))):
        pool.register(ScheduledPipeline(factory=build, schedule=Schedule.every(seconds=1), pipeline_id=f"bench-{index}"))
    return pool
