"""Take the README's dashboard screenshots: an api and a worker process (the example
worker) on a scratch database, some work, then chromium.

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
                await browser.close()
    finally:
        for process in (worker, api):
            process.terminate()
            process.wait(timeout=30)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
