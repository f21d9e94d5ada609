"""The dashboard in a real browser: Debian's chromium, driven by Playwright, against an
``agora-pg api`` process and an ``agora-pg worker`` process running the example worker.

Screenshots are saved under ``AGORA_PG_TEST_ARTEFACTS`` (default: ``test-artefacts/``
at the repository's root, ignored by git). Without chromium the test is skipped, saying
so, unless ``AGORA_PG_REQUIRE_BROWSER=1`` (``.ci/run`` installs chromium and sets it).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

import httpx
import pytest

from ..conftest import Processes
from .test_api_processes import REPO, cli, wait_ready, wait_status
from .test_worker_processes import free_port, stop, worker_env

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTEFACTS = Path(os.environ.get("AGORA_PG_TEST_ARTEFACTS", REPO / "test-artefacts"))

if CHROMIUM is None:
    if os.environ.get("AGORA_PG_REQUIRE_BROWSER") == "1":
        raise RuntimeError("AGORA_PG_REQUIRE_BROWSER=1 but no chromium: apt-get install -y chromium")
    pytest.skip("no chromium on this machine (apt-get install -y chromium)", allow_module_level=True)

from playwright.async_api import async_playwright, expect  # noqa: E402

STEP = 20_000  # ms: each thing the page should show without a reload
# Collects the page's Content-Security-Policy violations (what the policy blocked) from its start.
CSP_WATCH = ("window.cspViolations = []; document.addEventListener('securitypolicyviolation', "
             "e => window.cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));")


@pytest.mark.one_lane
async def test_the_dashboard_follows_jobs_and_schedules_live(database_url: str, processes: Processes) -> None:
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = worker_env(database_url)
    api = processes.start(cli("api", "--port", str(port)), env, REPO)
    worker = processes.start(cli("worker", "--module", "worker", "--health-port", str(free_port())), env, REPO)
    base = f"http://127.0.0.1:{port}"
    await wait_ready(base, api)
    async with httpx.AsyncClient(base_url=base, timeout=10) as client, async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport={"width": 1366, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            await page.add_init_script(CSP_WATCH)

            # The job list: a job submitted over HTTP appears and turns done, with no reload.
            await page.goto(f"{base}/ui/jobs")
            await expect(page.locator("#live")).to_have_text("live", timeout=STEP)
            await page.evaluate("window.agoraMarker = 'same page'")
            created = (await client.post("/jobs", json={"kind": "sleep", "payload": {"seconds": 2}})).json()
            row = page.locator(f"tr:has(a[href='/ui/jobs/{created['id']}'])")
            await expect(row).to_be_visible(timeout=STEP)
            await expect(row.locator(".badge")).to_have_text("done", timeout=STEP)

            # A job's page: its progress bar moves while it runs.
            slow = (await client.post("/jobs", json={"kind": "sleep", "payload": {"seconds": 6}})).json()
            await page.goto(f"{base}/ui/jobs/{slow['id']}")
            await page.evaluate("window.agoraMarker = 'same page'")
            bar = page.locator(f"[data-progress-job='{slow['id']}'] progress")
            await expect(bar).to_have_attribute("value", _one_of(range(1, 10)), timeout=STEP)  # part way
            partway = int(await bar.get_attribute("value") or 0)
            await expect(bar).to_have_attribute("value", _one_of(range(partway + 1, 11)), timeout=STEP)  # further
            await page.screenshot(path=str(ARTEFACTS / "dashboard-job-progress.png"), full_page=True)
            await expect(page.locator("#job-status")).to_have_text("done", timeout=STEP)
            assert await page.evaluate("window.agoraMarker") == "same page"

            # A failed job: retried with its button.
            failing = (await client.post("/jobs", json={"kind": "fail", "max_retries": 0})).json()
            await wait_status(client, failing["id"], "failed")
            await page.goto(f"{base}/ui/jobs/{failing['id']}")
            await page.get_by_role("button", name="Retry").click()
            await expect(page.locator("#toasts")).to_contain_text("due again", timeout=STEP)

            async def retried() -> bool:
                job = (await client.get(f"/jobs/{failing['id']}")).json()
                return job["attempt"] == 2 and job["status"] == "failed"

            await _eventually(retried)
            await expect(page.locator("tbody tr")).to_have_count(2, timeout=STEP)  # both attempts, live

            # Schedules: pause and resume the example's heartbeat with the buttons.
            await page.goto(f"{base}/ui/schedules")
            heartbeat = page.locator("article#heartbeat")
            # each run of the timeline is a bar with a height (its CSS was once invalid: 0 px)
            await heartbeat.locator(".timeline li").first.wait_for(timeout=STEP)
            heights = await heartbeat.locator(".timeline li").evaluate_all(
                "bars => bars.map(bar => bar.getBoundingClientRect().height)")
            assert heights and all(height >= 3 for height in heights), heights
            await heartbeat.get_by_role("button", name="Pause").click()
            await expect(heartbeat.locator("h2 .badge").first).to_have_text("paused", timeout=STEP)
            assert (await client.get("/schedules/heartbeat")).json()["state"] == "paused"
            await heartbeat.get_by_role("button", name="Resume").click()
            await expect(heartbeat.locator("h2 .badge").first).to_have_text("active", timeout=STEP)

            # The overview, with the hour's chart drawn.
            await page.goto(f"{base}/")
            await expect(page.locator(".chart canvas")).to_have_count(1, timeout=STEP)
            await expect(page.get_by_text("Workers alive")).to_be_visible()
            await page.screenshot(path=str(ARTEFACTS / "dashboard-overview.png"), full_page=True)
            assert errors == []
            for path in ("/ui/jobs", f"/ui/jobs/{failing['id']}", "/ui/runs", "/ui/schedules", "/ui/dead-letters", "/"):
                await page.goto(f"{base}{path}")
                await expect(page.locator("#content")).not_to_have_attribute("aria-busy", "true", timeout=STEP)
                assert await page.evaluate("window.cspViolations") == [], path  # the policy blocks nothing of ours

            # On a phone (390 px wide) no page scrolls sideways.
            phone = await browser.new_page(viewport={"width": 390, "height": 844})
            for path in ("/", "/ui/jobs", f"/ui/jobs/{failing['id']}", "/ui/runs", "/ui/schedules", "/ui/dead-letters"):
                await phone.goto(f"{base}{path}")
                await expect(phone.locator("#content")).not_to_have_attribute("aria-busy", "true", timeout=STEP)
                width = await phone.evaluate("document.documentElement.scrollWidth")
                assert width <= 390, (path, width)
            await phone.screenshot(path=str(ARTEFACTS / "dashboard-job-phone.png"), full_page=True)
        finally:
            await browser.close()
    code, output = stop(worker)
    assert code == 0, output
    code, output = stop(api)
    assert code == 0, output


@pytest.mark.one_lane
async def test_a_saved_token_is_sent_from_the_first_request(database_url: str, processes: Processes) -> None:
    """With the token in the tab's storage, a page loads its content at once: no 401, no
    token dialog (the first fragment request once went out before the token hook)."""
    port, token = free_port(), "browser-token-0123456789abcdef"
    api = processes.start(cli("api", "--port", str(port)), {**worker_env(database_url), "AGORA_PG_API_TOKEN": token},
                          REPO)
    base = f"http://127.0.0.1:{port}"
    await wait_ready(base, api)
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page()
            await page.add_init_script(f"sessionStorage.setItem('agora-pg-token', '{token}');")
            refused: list[str] = []
            page.on("response", lambda response: refused.append(response.url) if response.status == 401 else None)
            for path in ("/", "/ui/jobs"):
                await page.goto(f"{base}{path}")
                await expect(page.locator("#content")).not_to_have_attribute("aria-busy", "true", timeout=STEP)
                assert not await page.locator("#token-dialog").evaluate("dialog => dialog.open"), path
            assert refused == []
        finally:
            await browser.close()
    code, output = stop(api)
    assert code == 0, output


def _one_of(values: Iterable[int]) -> re.Pattern[str]:
    """An attribute value that is any of ``values`` (the page may skip a step between two updates)."""
    return re.compile("^(" + "|".join(str(value) for value in values) + ")$")


async def _eventually(check: object, timeout: float = 30) -> None:
    from .test_worker_processes import eventually
    await eventually(check, timeout, "the retried job's second attempt")  # type: ignore[arg-type]


