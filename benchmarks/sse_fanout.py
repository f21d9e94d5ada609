"""SSE fan-out: how many events an ``agora-pg api`` process sends to many clients at once.

    python -m benchmarks.sse_fanout [--clients 50] [--jobs 60000] [--database-url URL]

On a scratch database: one API process, ``--clients`` clients of ``GET /events`` (in
two client processes, so that reading them is not what limits the figure), and one
worker draining ``--jobs`` no-op jobs enqueued in batches of 1,000 (each job gives
``job.enqueued`` and ``job.finished``, and ``job.started`` when a read sees it
running). Each client counts the events it got and when; the API's rate is events
sent to one client per second over the window from the first to the last event,
and the fan-out rate is that times the clients. Every client must get the same
events: a client that got fewer is reported (it fell behind and was dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import httpx

from agora_pg.job_spec import JobSpec
from agora_pg.settings import load_settings
from benchmarks.drain import ROOT, scratch_database, worker_environment

from agora_pg.db.connect import resolve_database


def free_port() -> int:
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def client_process(base: str, clients: int, quiet_seconds: float) -> None:
    """Run ``clients`` SSE clients until no event came for ``quiet_seconds`` after the
    first; print one JSON line per client: events, first and last arrival."""
    results: list[dict[str, float]] = [{"events": 0, "first": 0.0, "last": 0.0} for _ in range(clients)]
    ready = 0

    async def one(index: int, client: httpx.AsyncClient) -> None:
        nonlocal ready
        result = results[index]
        async with client.stream("GET", "/events") as response:
            ready += 1
            async for line in response.aiter_lines():
                if line.startswith("event: ") and line != "event: ping":
                    now = time.time()
                    result["events"] += 1
                    result["first"] = result["first"] or now
                    result["last"] = now

    limits = httpx.Limits(max_connections=clients + 5)
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(10, read=None), limits=limits) as client:
        tasks = [asyncio.create_task(one(i, client)) for i in range(clients)]
        while ready < clients:
            await asyncio.sleep(0.05)
        print("READY", flush=True)
        while True:
            await asyncio.sleep(0.5)
            lasts = [r["last"] for r in results if r["last"]]
            if lasts and time.time() - max(lasts) > quiet_seconds:
                break
        for task in tasks:
            task.cancel()
    for result in results:
        print(json.dumps(result), flush=True)


async def run(args: argparse.Namespace) -> None:
    settings = load_settings(os.environ)
    if args.database_url:
        settings = settings.replace(database_url=args.database_url)
    async with resolve_database(settings) as server, scratch_database(settings.replace(database_url=server.url)) as (
        database, store
    ):
        env = worker_environment(AGORA_PG_DATABASE_URL=database.url, AGORA_PG_LOG_LEVEL="WARNING")
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        api = subprocess.Popen([sys.executable, "-m", "agora_pg.cli", "api", "--port", str(port)], cwd=ROOT, env=env)
        processes = [api]
        try:
            async with httpx.AsyncClient(base_url=base) as probe:
                for _ in range(200):
                    try:
                        if (await probe.get("/ready")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    await asyncio.sleep(0.1)
            halves = [args.clients // 2, args.clients - args.clients // 2]
            readers = [
                subprocess.Popen([sys.executable, "-m", "benchmarks.sse_fanout", "--client-of", base,
                                  "--clients", str(count)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
                for count in halves if count
            ]
            processes += readers
            for reader in readers:
                assert reader.stdout is not None
                assert reader.stdout.readline().strip() == "READY"
            worker = subprocess.Popen(
                [sys.executable, "-m", "agora_pg.cli", "worker", "--module", "benchmarks.noop_worker",
                 "--concurrency", "100"], cwd=ROOT, env=env)
            processes.append(worker)
            started = time.time()
            for offset in range(0, args.jobs, 1000):
                await store.jobs.enqueue([JobSpec("noop") for _ in range(min(1000, args.jobs - offset))])
            results = []
            for reader in readers:
                output, _ = reader.communicate(timeout=600)
                results += [json.loads(line) for line in output.splitlines() if line.startswith("{")]
            async with store.connection() as connection:
                done = await connection.fetchval("SELECT count(*) FROM agora.jobs WHERE status = 'done'")
        finally:
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    process.wait(timeout=60)
        counts = [r["events"] for r in results]
        rates = [r["events"] / max(r["last"] - r["first"], 1e-9) for r in results]
        window = max(r["last"] for r in results) - min(r["first"] for r in results)
        print(f"{len(results)} clients, {args.jobs} jobs enqueued ({done} done by the worker), "
              f"events per client: min {min(counts)}, max {max(counts)}")
        print(f"events/s to one client: median {statistics.median(rates):,.0f} (min {min(rates):,.0f}); "
              f"fan-out: {sum(counts) / window:,.0f} events/s in all over {window:.1f} s "
              f"(first event {min(r['first'] for r in results) - started:.2f} s after the first enqueue)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=60_000)
    parser.add_argument("--database-url")
    parser.add_argument("--client-of", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client_of:
        asyncio.run(client_process(args.client_of, args.clients, quiet_seconds=3.0))
    else:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
