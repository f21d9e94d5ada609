"""The Markdown table and the PNG chart of a comparison run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

Results = dict[str, Any]


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    return f"{value:,.{digits}f}"


def _ratio(ours: Any, theirs: Any, lower_is_better: bool = False) -> str:
    if not isinstance(ours, int | float) or not isinstance(theirs, int | float) or not ours or not theirs:
        return "n/a"
    ratio = theirs / ours if lower_is_better else ours / theirs
    return f"{ratio:.2f}x"


def markdown(results: Results) -> str:
    systems = results["systems"]  # key -> {"name", "describe", metrics...}
    ours = systems.get("agora", {})
    peers = [key for key in ("pgqueuer", "procrastinate") if key in systems]
    raw = results.get("raw", {})
    header = ["workload", "unit", ours.get("name", "agora-pg")] + [systems[k]["name"] for k in peers]
    header += ["raw SQL limit"] + [f"agora-pg vs {systems[k]['name'].split()[0]}" for k in peers] + ["agora-pg vs raw"]
    rows: list[list[str]] = []

    def row(label: str, unit: str, metric: str, raw_value: Any = None, raw_label: str = "",
            lower_is_better: bool = False, digits: int = 0) -> None:
        mine = ours.get(metric)
        cells = [label, unit, _fmt(mine, digits)] + [_fmt(systems[k].get(metric), digits) for k in peers]
        cells.append(f"{_fmt(raw_value, digits)} ({raw_label})" if raw_value is not None else "n/a")
        cells += [_ratio(mine, systems[k].get(metric), lower_is_better) for k in peers]
        cells.append(_ratio(mine, raw_value, lower_is_better) if raw_value is not None else "n/a")
        rows.append(cells)

    row("1. enqueue, one call per job", "jobs/s", "enqueue_one_per_s", raw.get("insert_one_1c"), "pgbench insert one, 1 client")
    row("1. enqueue, one call per job, against a Python client", "jobs/s", "enqueue_one_per_s",
        ours.get("plain_insert_per_s"), "asyncpg insert one into a plain table with agora.jobs' columns, "
        "around agora-pg's run")
    row("1. enqueue, batch API (median of 5)", "jobs/s", "enqueue_batch_per_s", raw.get("copy_10000"), "COPY 10,000 rows")
    for processes in results.get("processes", [1, 2, 4]):
        repeats = results.get("drain_repeats", 1)
        median = f" (median of {repeats})" if repeats > 1 else ""
        row(f"2. drain {results['drain_jobs']:,} jobs, {processes} process(es){median}", "jobs/s", f"drain_{processes}p",
            raw.get("claim_100_4c"), "claim+complete 100, 4 clients")
    for percentile in ("p50", "p95", "p99"):
        row(f"3. wake-up latency {percentile}", "ms (lower is better)", f"wakeup_{percentile}",
            lower_is_better=True, digits=1)
    for metric, label in (("lag_every_p50", "p50"), ("lag_every_p99", "p99")):
        row(f"4. schedule lag, 200 every(seconds=1), {label}", "ms (lower is better)", metric,
            lower_is_better=True, digits=1)
    for metric, label in (("lag_cron_p50", "p50"), ("lag_cron_p99", "p99")):
        row(f"4. schedule lag, 1,000 cron * * * * *, {label}", "ms (lower is better)", metric,
            lower_is_better=True, digits=1)
    reference = ours.get("drain_empty_1p_median", ours.get("drain_1p"))
    row(f"5. drain, 1 process, {results.get('history', 0):,} finished jobs in history (median of 3)", "jobs/s",
        "drain_grown_1p", reference, "agora-pg on the empty table, median of 3")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    lines += ["", "Raw SQL limit (pgbench custom scripts on a plain jobs table; jobs/s):", "",
              "| script | 1 client | 4 clients |", "|---|---:|---:|"]
    for script, label in (("insert_one", "insert one job (one durable commit)"),
                          ("claim_one", "claim one with SKIP LOCKED and complete it, one transaction"),
                          ("claim_100", "claim 100 with SKIP LOCKED and complete them, one transaction"),
                          ("claim_100_ordered", "the same in agora-pg's claim order (queue, priority, run_at)")):
        lines.append(f"| {label} | {_fmt(raw.get(f'{script}_1c'))} | {_fmt(raw.get(f'{script}_4c'))} |")
    lines.append(f"| COPY of 10,000 rows | {_fmt(raw.get('copy_10000'))} | |")
    lines += work_table(results)
    lines += targets_table(results)
    lines += ["", "Settings of each system:", ""]
    lines += [f"- {systems[k]['name']}: {systems[k]['describe']}" for k in ["agora", *peers] if k in systems]
    if results.get("errors"):
        lines += ["", "Errors:", ""] + [f"- {error}" for error in results["errors"]]
    return "\n".join(lines) + "\n"


# The speed targets (issue 38): (label, our metric, where its limit is, the limit's metric, the
# ratio that meets it, and whether that ratio is a floor or a ceiling). Each is a ratio to
# something measured in the same run; a dotted metric reads inside a nested result.
TARGETS = (
    ("enqueue one at a time vs PgQueuer", "enqueue_one_per_s", "pgqueuer", "enqueue_one_per_s", 1.2, "at least"),
    ("enqueue one at a time vs a bare asyncpg insert, same columns", "enqueue_one_per_s", "agora",
     "plain_insert_per_s", 0.9, "at least"),
    ("batch enqueue vs PgQueuer", "enqueue_batch_per_s", "pgqueuer", "enqueue_batch_per_s", 1.5, "at least"),
    ("drain, 1 process, vs pgbench claim+complete 100 in claim order, 1 client", "drain_1p", "raw",
     "claim_100_ordered_1c", 0.75, "at least"),
    ("drain, 1 process, vs PgQueuer", "drain_1p", "pgqueuer", "drain_1p", 2.5, "at least"),
    ("server CPU per job, concurrency 10 vs 500", "work_low_concurrency.server_cpu_us", "agora",
     "work.server_cpu_us", 2.0, "at most"),
)


def _metric(source: dict[str, Any], dotted: str) -> Any:
    value: Any = source
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def targets_table(results: Results) -> list[str]:
    """Each speed target's ratio in this run, and whether it is met (rows whose figures
    this run did not measure are left out)."""
    systems, ours = results["systems"], results["systems"].get("agora", {})
    lines = ["", "Targets (each a ratio to a limit measured in this run):", "",
             "| target | ratio | needed | met |", "|---|---:|---:|---|"]
    for label, metric, where, limit_metric, needed, bound in TARGETS:
        limit = _metric(results.get("raw", {}) if where == "raw" else systems.get(where, {}), limit_metric)
        mine = _metric(ours, metric)
        if not isinstance(mine, int | float) or not isinstance(limit, int | float) or not limit:
            continue
        ratio = mine / limit
        met = ratio >= needed if bound == "at least" else ratio <= needed
        sign = "≥" if bound == "at least" else "≤"
        lines.append(f"| {label} | {ratio:.2f}x | {sign} {needed:.2f}x | {'yes' if met else 'no'} |")
    return lines if len(lines) > 5 else []


WORK_COLUMNS = (
    ("drain_per_s", "drain jobs/s", 0), ("server_cpu_us", "server CPU us", 1), ("worker_cpu_us", "worker CPU us", 1),
    ("worker_peak_rss_mb", "worker peak RSS MB", 0),
    ("wal_bytes", "WAL bytes", 0), ("wal_records", "WAL records", 2), ("wal_fpi", "full-page images", 3),
    ("commits", "commits", 3), ("rows_written", "rows written", 2),
)


def work_table(results: Results) -> list[str]:
    """The server's work per job of each system's one-process drain (empty if not measured)."""
    measured = [(system["name"], system["work"]) for system in results["systems"].values() if system.get("work")]
    low = results["systems"].get("agora", {}).get("work_low_concurrency")
    if low:
        from benchmarks.compare.systems.agora import LOW_CONCURRENCY

        measured.append((f"agora-pg, --concurrency {LOW_CONCURRENCY}", low))
    if not measured:
        return []
    lines = ["", "Server work per job, one worker process draining pre-enqueued no-op jobs (after a CHECKPOINT):",
             "", "| system | jobs | " + " | ".join(label for _, label, _ in WORK_COLUMNS) + " |",
             "|---|---:|" + "---:|" * len(WORK_COLUMNS)]
    for name, work in measured:
        lines.append(f"| {name} | {work['jobs']:,} | "
                     + " | ".join(_fmt(work.get(key), digits) for key, _, digits in WORK_COLUMNS) + " |")
    return lines


def chart(results: Results, path: Path) -> bool:
    """Drain rate against worker processes, one line per system; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    processes = results.get("processes", [1, 2, 4])
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=110)
    for key, system in results["systems"].items():
        values = [system.get(f"drain_{p}p") for p in processes]
        if all(isinstance(v, int | float) for v in values):
            axes.plot(processes, values, marker="o", label=system["name"])
    raw = results.get("raw", {})
    for metric, label, style in (("claim_100_1c", "raw claim+complete 100, 1 client", ":"),
                                 ("claim_100_4c", "raw claim+complete 100, 4 clients", "--")):
        if metric in raw:
            axes.axhline(raw[metric], linestyle=style, color="grey", label=label)
    axes.set_xlabel("worker processes")
    axes.set_ylabel("jobs/s (first to last completion)")
    axes.set_xticks(processes)
    axes.set_title(f"Drain of {results['drain_jobs']:,} no-op jobs")
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return True
