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

import asyncpg
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
# The words of the page's table cells that the browser broke mid-token ("pendi|ng",
# "cust|ome|r_id"), and the status badges that wrap at all, each as "text (in <tag>)"
# with a "|" where a line ends. A word is a run of characters between breakable spaces
# ("3&nbsp;/&nbsp;5" is one); a line ends where its characters' client rects move down. A
# word may end a line only right after a separator (an id's "-", "_", ".", ":" or "/").
BROKEN_TOKENS = r"""() => {
  const SEPARATORS = "-_.:/";
  const top = (node, start, end) => {
    const range = document.createRange();
    range.setStart(node, start);
    range.setEnd(node, end);
    const rect = Array.from(range.getClientRects()).find(rect => rect.width > 0 && rect.height > 0);
    return rect ? { top: rect.top, height: rect.height } : null;
  };
  const broken = new Set();
  for (const element of document.querySelectorAll("td, th, .badge")) {
    const badge = element.matches(".badge");  // a badge: its whole text on one line
    const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (node.parentElement.closest("pre, .visually-hidden")) { continue; }
      const text = node.data.replace(/[ \t\n\r\f]+$/, "");
      for (const word of text.matchAll(badge ? /[^ \t\n\r\f][^]*/g : /[^ \t\n\r\f]+/g)) {
        let shown = word[0][0], bad = false, line = top(node, word.index, word.index + 1);
        for (let i = 1; i < word[0].length; i++) {
          const here = top(node, word.index + i, word.index + i + 1);
          if (line && here && here.top - line.top > line.height / 2) {  // a new line starts at i
            shown += "|";
            bad = bad || badge || !SEPARATORS.includes(word[0][i - 1]);
          }
          shown += word[0][i];
          line = here || line;
        }
        if (bad) { broken.add(`${shown} (in <${element.tagName.toLowerCase()}>)`); }
      }
    }
  }
  return Array.from(broken);
}"""


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

            # Long names and ids in every table: flow control of a kind keyed by customer_id,
            # jobs of it (one with a progress report) in a limited queue, a dead letter.
            exported = await _long_names(database_url, client)

            # No table cell breaks a word or an id mid-token and no status badge wraps, on a
            # desktop and on a phone (390 px wide); on a phone no page scrolls sideways: a
            # wide table scrolls in its own box.
            pages = {  # path: text that shows its fragment (with the long names) is there
                "/": "customer_report_export", "/ui/jobs": "customer_report_export",
                f"/ui/jobs/{failing['id']}": "this job always fails", "/ui/runs": "heartbeat",
                "/ui/schedules": "heartbeat", "/ui/dead-letters": "nightly_customer-sync.v2",
            }
            broken: list[str] = []
            for width, height in ((1280, 800), (390, 844)):
                view = await browser.new_page(viewport={"width": width, "height": height})
                for path, shown in pages.items():
                    await view.goto(f"{base}{path}")
                    await expect(view.locator("#content")).to_contain_text(shown, timeout=STEP)
                    broken += [f"{width} px {path}: {word}" for word in await view.evaluate(BROKEN_TOKENS)]
                    if width == 390:
                        scroll_width = await view.evaluate("document.documentElement.scrollWidth")
                        assert scroll_width <= 390, (path, scroll_width)
                        name = path.strip("/").replace("/", "-").replace("ui-", "") or "overview"
                        await view.screenshot(path=str(ARTEFACTS / f"dashboard-phone-{name}.png"), full_page=True)
                if width == 390:  # the progress column is reachable: its box scrolls to it
                    await view.goto(f"{base}/ui/jobs")
                    bar = view.locator(f"[data-progress-job='{exported}'] progress")
                    await bar.scroll_into_view_if_needed(timeout=STEP)
                    box = await bar.bounding_box()
                    assert box is not None and 0 <= box["x"] and box["x"] + box["width"] <= 390, box
                await view.close()
            assert broken == [], "\n".join(broken)
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


async def _long_names(database_url: str, client: httpx.AsyncClient) -> int:
    """What a real deployment's tables hold: a kind limited per customer_id in a limited
    queue, three jobs of it waiting (no worker handles it; one with a progress report),
    and a dead letter of a pipeline with a long id. Returns the job with the report."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            "INSERT INTO agora.kind_limits (kind, concurrency, limit_by, rate, rate_seconds, declared_in) "
            "VALUES ('customer_report_export', 2, 'customer_id', 10, 60, 'config')")
        await connection.execute(
            "INSERT INTO agora.queue_limits (queue, concurrency, declared_in) VALUES ('reports_eu-west', 1, 'config')")
        ids = []
        for customer in ("cust_0001_eu-west", "cust_0002_eu-west", "cust_0003_eu-west"):
            answer = await client.post("/jobs", json={"kind": "customer_report_export", "queue": "reports_eu-west",
                                                      "payload": {"customer_id": customer}})
            assert answer.status_code == 201, answer.text
            ids.append(answer.json()["id"])
        await connection.execute(
            "UPDATE agora.jobs SET progress = jsonb_build_object('done', 3, 'total', 5, 'message', "
            "'exported 3 of 5 customer_invoice files') WHERE id = $1", ids[0])
        await connection.execute(
            "INSERT INTO agora.dead_letters (pipeline_id, stage, record, error_type, error_message) VALUES "
            "('nightly_customer-sync.v2', 'load_customer_totals', $1, 'CheckViolationError', "
            "'new row for relation \"customer_totals\" violates check constraint \"customer_totals_amount_check\"')",
            '{"customer_id": "cust_0001_eu-west", "amount": -3.25}')
    finally:
        await connection.close()
    return ids[0]


def _one_of(values: Iterable[int]) -> re.Pattern[str]:
    """An attribute value that is any of ``values`` (the page may skip a step between two updates)."""
    return re.compile("^(" + "|".join(str(value) for value in values) + ")$")


async def _eventually(check: object, timeout: float = 30) -> None:
    from .test_worker_processes import eventually
    await eventually(check, timeout, "the retried job's second attempt")  # type: ignore[arg-type]


