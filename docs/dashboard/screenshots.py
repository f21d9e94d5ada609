"""Take the README's dashboard screenshots: an api and a worker process (the example
worker) on a scratch database, some work, then chromium: the desktop pictures at 1280 px
(overview.png, job.png, jobs.png), then, with flow control, a job of a kind nobody
handles yet and a dead letter added, the phone pictures at 390 px (phone-*.png).

    python docs/dashboard/screenshots.py postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import httpx
from playwright.async_api import async_playwright

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def main(server_url: str) -> None:
    name = f"agora_screens_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(server_url)
    await admin.execute(f'CREATE DATABASE "{name}"')  # (a name made here, not input)
    url = server_url.rsplit("/", 1)[0] + f"/{name}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGORA_PG_", "WORKER_", "DATABASE_URL"))}
    env.update(AGORA_PG_DATABASE_URL=url, WORKER_CONCURRENCY="4", WORKER_RETRY_BACKOFF_SECONDS="1")
    port = free_port()
    cli = [sys.executable, "-m", "agora_pg.cli"]
    subprocess.run([*cli, "migrate"], env=env, check=True, cwd=REPO)
    api = subprocess.Popen([*cli, "api", "--port", str(port)], env=env, cwd=REPO)
    worker = subprocess.Popen([*cli, "worker", "--module", "worker", "--health-port", str(free_port())], env=env, cwd=REPO)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            for _ in range(100):
                try:
                    if (await client.get("/ready")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.2)
            for i in range(30):
                await client.post("/jobs", json={"kind": "echo", "payload": {"n": i}})
            for _ in range(3):
                await client.post("/jobs", json={"kind": "fail", "max_retries": 1})
            for seconds in (20, 30, 40):
                await client.post("/jobs", json={"kind": "sleep", "payload": {"seconds": seconds}})
            for i in range(12):
                await client.post("/jobs", json={"kind": "report", "queue": "reports", "payload": {"month": i + 1}})
            await asyncio.sleep(9)
            slow = (await client.get("/jobs", params={"kind": "sleep", "status": "processing"})).json()["items"][0]
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
                page = await browser.new_page(viewport={"width": 1280, "height": 800})
                await page.goto(f"{base}/")
                await page.wait_for_selector(".chart canvas")
                await asyncio.sleep(1.5)
                await page.screenshot(path=str(HERE / "overview.png"))
                await page.goto(f"{base}/ui/jobs/{slow['id']}")
                await page.wait_for_selector("progress")
                await asyncio.sleep(2.5)
                await page.screenshot(path=str(HERE / "job.png"))
                await page.goto(f"{base}/ui/jobs")
                await page.wait_for_selector("tbody tr")
                await asyncio.sleep(1.5)
                await page.screenshot(path=str(HERE / "jobs.png"))
                await long_names(url, client)
                failed = (await client.get("/jobs", params={"kind": "fail", "status": "failed"})).json()["items"][0]
                phone = await browser.new_page(viewport={"width": 390, "height": 844})
                for picture, path in (("jobs", "/ui/jobs"), ("runs", "/ui/runs"), ("job", f"/ui/jobs/{failed['id']}"),
                                      ("dead-letters", "/ui/dead-letters")):
                    await phone.goto(f"{base}{path}")
                    await phone.wait_for_selector("#content table")
                    await asyncio.sleep(1.5)
                    await phone.screenshot(path=str(HERE / f"phone-{picture}.png"))
                    for _ in range(5):  # the list's box scrolled sideways to its status and progress columns
                        if picture != "jobs":  # (again if a live refresh put a new list in between)
                            break
                        box = phone.locator(".table-box")
                        await box.evaluate("box => { box.scrollLeft = box.querySelectorAll('thead th')[3].offsetLeft; }")
                        await phone.screenshot(path=str(HERE / "phone-jobs-scrolled.png"))
                        if await box.evaluate("box => box.scrollLeft > 0"):
                            break
                await phone.goto(f"{base}/")
                await phone.wait_for_selector("article.wide table")
                await asyncio.sleep(1.5)
                await phone.locator("article.wide").filter(has_text="Flow control").screenshot(
                    path=str(HERE / "phone-flow-control.png"))
                await browser.close()
    finally:
        for process in (worker, api):
            process.terminate()
            process.wait(timeout=30)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def long_names(url: str, client: httpx.AsyncClient) -> None:
    """Names as long as real ones: a kind limited per customer_id in a limited queue (no
    worker handles it yet: its jobs wait, one with a progress report) and a dead letter."""
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(
            "INSERT INTO agora.kind_limits (kind, concurrency, limit_by, rate, rate_seconds, declared_in) "
            "VALUES ('customer_report_export', 2, 'customer_id', 10, 60, 'config')")
        await connection.execute(
            "INSERT INTO agora.queue_limits (queue, concurrency, declared_in) VALUES ('reports_eu-west', 1, 'config')")
        ids = [(await client.post("/jobs", json={"kind": "customer_report_export", "queue": "reports_eu-west",
                                                 "payload": {"customer_id": f"cust_{n:04d}_eu-west"}})).json()["id"]
               for n in range(1, 4)]
        await connection.execute(
            "UPDATE agora.jobs SET progress = jsonb_build_object('done', 3, 'total', 5, 'message', "
            "'exported 3 of 5 invoice files') WHERE id = $1", ids[-1])
        await connection.execute(
            "INSERT INTO agora.dead_letters (pipeline_id, stage, record, error_type, error_message) VALUES "
            "('nightly_customer-sync.v2', 'load_customer_totals', $1, 'CheckViolationError', "
            "'new row for relation \"customer_totals\" violates check constraint \"customer_totals_amount_check\"')",
            '{"customer_id": "cust_0001_eu-west", "amount": -3.25}')
    finally:
        await connection.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
