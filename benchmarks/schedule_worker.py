"""BENCH_PIPELINES no-op pipelines: `--module benchmarks.schedule_worker`.

BENCH_SCHEDULE=every1s (default) gives Schedule.every(seconds=1); cron gives Schedule.cron("* * * * *").
"""

import os

from agora_pg.runner import Schedule, ScheduledPipeline, WorkerPool


class Noop:
    async def run(self) -> None:
        return None


async def build() -> Noop:
    return Noop()


def get_worker() -> WorkerPool:
    schedule = Schedule.cron("* * * * *") if os.environ.get("BENCH_SCHEDULE") == "cron" else Schedule.every(seconds=1)
    pool = WorkerPool()
    for index in range(int(os.environ.get("BENCH_PIPELINES", "200"))):
        pool.register(ScheduledPipeline(factory=build, schedule=schedule, pipeline_id=f"bench-{index}"))
    return pool
