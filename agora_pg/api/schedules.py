"""``/schedules``: the durable state of scheduled pipelines; pause, resume, trigger, delete."""

from __future__ import annotations

from litestar import Controller, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath

from agora_pg.api import params
from agora_pg.api.schemas import ScheduleOut
from agora_pg.db.store import Store
from agora_pg.errors import ScheduleNotFound


class ScheduleController(Controller):
    path = "/schedules"
    tags = ["schedules"]

    @get("/")
    async def list_schedules(self, store: NamedDependency[Store]) -> list[ScheduleOut]:
        """Every schedule, by pipeline id."""
        return [ScheduleOut.of(row) for row in await store.schedules.all()]

    @get("/{pipeline_id:str}")
    async def get_schedule(self, pipeline_id: FromPath[str], store: NamedDependency[Store]) -> ScheduleOut:
        row = await store.schedules.get(_pipeline_id(pipeline_id))
        if row is None:
            raise ScheduleNotFound(pipeline_id)
        return ScheduleOut.of(row)

    @post("/{pipeline_id:str}/pause", status_code=200)
    async def pause(self, pipeline_id: FromPath[str], store: NamedDependency[Store]) -> ScheduleOut:
        """No new run starts until resumed; a run in progress finishes."""
        return ScheduleOut.of(await store.schedules.pause(_pipeline_id(pipeline_id)))

    @post("/{pipeline_id:str}/resume", status_code=200)
    async def resume(self, pipeline_id: FromPath[str], store: NamedDependency[Store]) -> ScheduleOut:
        """Start a paused schedule again, or a stopped one (its error count reset, due now)."""
        return ScheduleOut.of(await store.schedules.resume(_pipeline_id(pipeline_id)))

    @post("/{pipeline_id:str}/trigger", status_code=200)
    async def trigger(self, pipeline_id: FromPath[str], store: NamedDependency[Store]) -> ScheduleOut:
        """Run an active, idle schedule now, once; then it keeps its schedule."""
        return ScheduleOut.of(await store.schedules.trigger(_pipeline_id(pipeline_id)))


    @delete("/{pipeline_id:str}", status_code=200)
    async def delete_schedule(self, pipeline_id: FromPath[str], store: NamedDependency[Store]) -> ScheduleOut:
        """Delete a schedule and its future ticks (a run that has not started is cancelled,
        one under way finishes); its run history stays. Returns the schedule as it was. A
        worker whose code still declares it declares it again when it next starts."""
        row, _cancelled = await store.schedules.delete(_pipeline_id(pipeline_id))
        return ScheduleOut.of(row)


def _pipeline_id(value: str) -> str:
    return params.text_filter("pipeline_id", value) or value  # (checked; None only for None)
