"""Request rate of the API with one uvicorn worker, measured with wrk over loopback.

    apt-get install wrk
    python -m benchmarks.api_rate [--database-url URL] [--seconds 10] [--connections 16]

Starts `agora-pg api` on a scratch database (10,000 pending jobs preloaded so that
the listing reads a realistic index), then runs wrk against `POST /jobs` and
`GET /jobs?status=pending`, and prints requests per second and latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from benchmarks.drain import ROOT, enqueue, scratch_database, worker_environment
from agora_pg.settings import load_settings

POST_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"kind": "noop", "payload": {"to": "someone@example.com", "n": 1}}'
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_ready(base: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"agora-pg api exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the API did not become ready within 60 s")


def run_wrk(url: str, seconds: int, connections: int, script: str | None) -> dict[str, float]:
    args = ["wrk", "-t", "2", "-c", str(connections), "-d", f"{seconds}s", "--latency", url]
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as lua:
        if script:
            lua.write(script)
    if script:
        args[1:1] = ["-s", lua.name]
    try:
        output = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(lua.name)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    return {
        "requests_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)),  # type: ignore[union-attr]
        "p50_ms": _ms(re.search(r"50%\s+([\d.]+\w+)", output).group(1)),  # type: ignore[union-attr]
        "p99_ms": _ms(re.search(r"99%\s+([\d.]+\w+)", output).group(1)),  # type: ignore[union-attr]
        "non_2xx": float(non_2xx.group(1)) if non_2xx else 0.0,
    }


def _ms(text: str) -> float:
    value, unit = float(re.match(r"[\d.]+", text).group(0)), re.sub(r"[\d.]+", "", text)  # type: ignore[union-attr]
    return value * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("api_rate: wrk not found (apt-get install wrk)")
    settings = load_settings(os.environ)
    if args.database_url:
        settings = settings.replace(database_url=args.database_url)
    async with scratch_database(settings) as (database, store):
        await enqueue(store, 10_000)
        async with store.connection() as connection:  # statistics, as autovacuum would have them by now
            await connection.execute("ANALYZE agora.jobs")
        port = free_port()
        env = worker_environment(AGORA_PG_DATABASE_URL=database.url)
        api = subprocess.Popen([sys.executable, "-m", "agora_pg.cli", "--log-level", "WARNING", "api", "--port", str(port)],
                               cwd=ROOT, env=env)
        base = f"http://127.0.0.1:{port}"
        try:
            await asyncio.to_thread(wait_ready, base, api)
            results = {
                "POST /jobs": run_wrk(f"{base}/jobs", args.seconds, args.connections, POST_SCRIPT),
                "GET /jobs?status=pending": run_wrk(f"{base}/jobs?status=pending", args.seconds, args.connections, None),
            }
        finally:
            api.send_signal(signal.SIGTERM)
            api.wait(timeout=30)
    print(f"one uvicorn worker, wrk -t2 -c{args.connections} -d{args.seconds}s over loopback, {os.cpu_count()} cores")
    for name, figures in results.items():
        print(f"{name:26} {figures['requests_per_s']:8.0f} req/s  p50 {figures['p50_ms']:.1f} ms  "
              f"p99 {figures['p99_ms']:.1f} ms  non-2xx {figures['non_2xx']:.0f}")
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
