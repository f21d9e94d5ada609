"""The chaos scenarios at their short size, each judged by thresholds written before it
runs (``Result.violations``): 0 lost, 0 stuck, duplicates only where explained, recovery
to 90 % of the baseline throughput within 10 s of the fault ending, plus each scenario's
own checks. ``python -m tests.chaos.report`` runs them at full size."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import Processes
from .harness import SHORT, table
from .scenarios import SCENARIOS, ScenarioSkipped, Setup

pytestmark = pytest.mark.chaos
LANES = 2  # scenarios wait far more than they compute: two run at a time, each lane one after another


def _in_lanes(names: list[str]) -> list[object]:
    """Each scenario in the pytest-xdist group of its lane: a lane's scenarios share one worker."""
    return [pytest.param(name, marks=pytest.mark.xdist_group(f"chaos-{index % LANES}"))
            for index, name in enumerate(names)]


@pytest.mark.connections(80)
@pytest.mark.parametrize("name", _in_lanes(list(SCENARIOS)))
async def test_scenario(name: str, database_url: str, tmp_path: Path, processes: Processes) -> None:
    setup = Setup(database_url, tmp_path, processes.started.append)
    try:
        result = await SCENARIOS[name](setup, SHORT)
    except ScenarioSkipped as reason:
        pytest.skip(str(reason))
    print("\n" + table([result]))
    logs = "\n".join(path.read_text(errors="replace")[-2000:] for path in (tmp_path / "logs").glob("*.log"))
    assert result.tally.enqueued > 0
    assert result.violations() == [], f"{table([result])}\n{logs}"
