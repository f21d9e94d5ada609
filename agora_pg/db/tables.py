"""The ``agora`` schema as SQLAlchemy metadata.

Alembic migrations create the tables; this metadata exists so that
autogenerate can check that the migrations and the code agree (a test does).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    Identity,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from agora_pg.db.predicates import ALIVE as ALIVE
from agora_pg.db.predicates import CLAIMABLE as CLAIMABLE
from agora_pg.db.predicates import CLAIMABLE_NOW as CLAIMABLE_NOW

SCHEMA = "agora"

metadata = MetaData(schema=SCHEMA)

JOB_LEASE_COMMENT = (
    "A lease of the job's own (claimed by a worker without a worker lease, such as one of an earlier version): "
    "once passed, another worker rescues the job. NULL while its worker's lease (agora.workers.lease_expires_at) "
    "covers it."
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True, comment="Job id, assigned by the database."),
    Column("name", Text, nullable=False, comment="Human-readable label; not interpreted."),
    Column("kind", Text, nullable=False, comment="Dispatch key: the worker runs HANDLERS[kind]."),
    Column("queue", Text, nullable=False, server_default=text("'default'"), comment="Queue name; workers take jobs from the queues they were started with."),
    Column("status", Text, nullable=False, server_default=text("'pending'"), comment="pending, processing, done, failed or cancelled."),
    Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb"), comment="Handler arguments, a JSON object."),
    Column("priority", Integer, nullable=False, server_default=text("0"), comment="Higher runs first among due jobs."),
    Column("run_at", DateTime(timezone=True), nullable=False, server_default=text("now()"), comment="Not claimed before this time; also the time of the next retry."),
    Column("retry_count", Integer, nullable=False, server_default=text("0"), comment="Failed attempts so far (lost attempts are counted in lost_count)."),
    Column("max_retries", Integer, nullable=True, comment="Failed attempts after which the job stays failed; NULL takes the worker's WORKER_MAX_RETRIES."),
    Column("error_message", Text, nullable=True, comment="Type and text of the last error."),
    Column("dedup_key", Text, nullable=True, comment="At most one pending, processing or retrying job per key."),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()"), comment="When the job was enqueued."),
    Column("started_at", DateTime(timezone=True), nullable=True, comment="When the latest attempt was claimed."),
    Column("finished_at", DateTime(timezone=True), nullable=True, comment="When the latest attempt ended."),
    Column("locked_by", Text, nullable=True, comment="Id of the worker running the job (agora.workers.id)."),
    Column("lease_expires_at", DateTime(timezone=True), nullable=True, comment=JOB_LEASE_COMMENT),
    Column("attempt", Integer, nullable=False, server_default=text("0"), comment="Claim counter and fencing token: completions must name the current attempt."),
    Column("lost_count", Integer, nullable=False, server_default=text("0"), comment="Attempts lost with their worker or cut short at shutdown; WORKER_MAX_LOST_ATTEMPTS of them fail the job."),
    Column("timeout_seconds", Float, nullable=True, comment="Seconds an attempt may run before it is cancelled; NULL takes the kind's or the worker's default."),
    Column("cancel_requested_at", DateTime(timezone=True), nullable=True, comment="When a cancel of the running attempt was asked for; its worker stops it."),
    Column("progress", JSONB, nullable=True, comment="The running attempt's latest progress report ({done, total, message, at}); kept with the run when it ends."),
    Column("delayed", Boolean, nullable=False, server_default=text("false"), comment="The job waits for its run_at (enqueued for later, or backing off before a retry): it is outside the claim index until a worker's promotion clears this once run_at has passed."),
    Column("fair_key", Text(collation="C"), nullable=True, comment="The job's key for fair share (its kind's fair_by, else limit_by, payload field), written at insert; NULL: its kind has none."),
    Column("schedule_id", Text, nullable=True, comment="The schedule (agora.schedules.pipeline_id) this job runs a tick of, or the pipeline it runs once; NULL: a plain job."),
    Column("scheduled_for", DateTime(timezone=True), nullable=True, comment="The tick this job runs (a schedule's), or when a pipeline's run outside its schedule was asked for."),
    Column("run_plan", JSONB, nullable=True, comment="A pipeline's run: {spec, next_at or next_in_seconds, launch}, what its end writes to its schedule ({} outside its schedule); its one attempt is the run (its schedule, not the job, retries). NULL: not a pipeline's run."),
    # The job row's eleven rules (status values, each status tied to its columns, no
    # negative counters, an object payload, a positive timeout) in one function, which
    # names the broken rule's constraint (migration 0014).
    CheckConstraint("agora.job_row_is_valid(status, locked_by, lease_expires_at, started_at, finished_at, delayed, "
                    "payload, retry_count, max_retries, lost_count, timeout_seconds)", name="jobs_row_check"),
    comment="One row per job; workers claim due rows with FOR UPDATE SKIP LOCKED.",
)

Index(
    "jobs_claimable_idx",
    jobs.c.queue,
    jobs.c.kind,
    jobs.c.priority.desc(),
    jobs.c.run_at,
    jobs.c.id,
    postgresql_where=text(CLAIMABLE_NOW),
)
Index("jobs_delayed_idx", jobs.c.run_at, postgresql_where=text("delayed"))
# The keys of fair share with claimable jobs, each key's in claim order (migration 0017).
Index(
    "jobs_fair_idx",
    jobs.c.queue,
    jobs.c.fair_key,
    jobs.c.priority.desc(),
    jobs.c.run_at,
    jobs.c.id,
    postgresql_where=text(f"{CLAIMABLE_NOW} AND fair_key IS NOT NULL"),
)
Index("jobs_dedup_key_idx", jobs.c.dedup_key, unique=True, postgresql_where=text(ALIVE))
Index(
    "jobs_lease_idx",
    jobs.c.lease_expires_at,
    postgresql_where=text("status = 'processing' AND lease_expires_at IS NOT NULL"),
)
Index("jobs_locked_by_idx", jobs.c.locked_by, postgresql_where=text("status = 'processing'"))
Index("jobs_created_at_brin", jobs.c.created_at, postgresql_using="brin")
Index("jobs_cancelled_idx", jobs.c.finished_at, postgresql_where=text("status = 'cancelled'"))
Index("jobs_schedule_idx", jobs.c.schedule_id, jobs.c.scheduled_for, postgresql_where=text("schedule_id IS NOT NULL"))

runs = Table(
    "runs",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True, comment="Run id."),
    # (no foreign key: the triggers of migration 0011 delete a job's runs with the job)
    Column("job_id", BigInteger, nullable=True, comment="The job this attempt ran, if any."),
    Column("pipeline_id", Text, nullable=True, comment="The scheduled pipeline this run belongs to, if any."),
    Column("attempt", Integer, nullable=False, server_default=text("1"), comment="Which claim of the job this was (agora.jobs.attempt at the time)."),
    Column("worker_id", Text, nullable=True, comment="The worker that ran it (agora.workers.id)."),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=text("now()"), comment="When the attempt began."),
    Column("finished_at", DateTime(timezone=True), nullable=True, comment="When the attempt ended; NULL while running."),
    Column("status", Text, nullable=False, server_default=text("'running'"), comment="running, succeeded, failed, abandoned (lease lost: worker gone or cut off) or cancelled (on request, or released at shutdown)."),
    Column("error_type", Text, nullable=True, comment="Exception class name of a failed attempt."),
    Column("error_message", Text, nullable=True, comment="Type and text of the error."),
    Column("scheduled_for", DateTime(timezone=True), nullable=True, comment="The schedule tick the run belongs to (a pipeline's run, or a periodic job's tick); not unique: a run retried by hand is another run of its tick."),
    Column("traceback", Text, nullable=True, comment="Traceback of a failed attempt (capped in size)."),
    Column("progress", JSONB, nullable=True, comment="Latest progress of the attempt: a job's last report, a pipeline run's records read, written and rejected."),
    Column("result", JSONB, nullable=True, comment="What the handler of a succeeded attempt returned, as JSON (NULL: it returned None, or a value JSON cannot hold). Kept as long as the run row: history retention removes it with its job."),
    CheckConstraint("status IN ('running', 'succeeded', 'failed', 'abandoned', 'cancelled')", name="runs_status_check"),
    comment="One row per execution attempt: job attempts and scheduled-pipeline runs.",
)

Index("runs_job_attempt_idx", runs.c.job_id, runs.c.attempt, unique=True, postgresql_where=text("job_id IS NOT NULL"))
Index("runs_finished_at_idx", runs.c.finished_at)
Index("runs_pipeline_started_idx", runs.c.started_at, postgresql_where=text("pipeline_id IS NOT NULL"))
Index(
    "runs_pipeline_tick_idx",
    runs.c.pipeline_id,
    runs.c.scheduled_for,
    postgresql_where=text("pipeline_id IS NOT NULL"),
)

# (migration 0010 sets the table's fillfactor to 50: a run's end rewrites its row in place)
schedules = Table(
    "schedules",
    metadata,
    Column("pipeline_id", Text, primary_key=True, comment="The ScheduledPipeline's pipeline_id."),
    Column("schedule_kind", Text, nullable=False, comment="every, cron, continuous or once."),
    Column("schedule_spec", Text, nullable=False, comment="Canonical form of the schedule, e.g. 'every 3600s' or 'cron 0 2 * * * Europe/Berlin'."),
    Column("state", Text, nullable=False, server_default=text("'active'"), comment="active, paused, stopped (after max_consecutive_errors) or completed (a once schedule that succeeded)."),
    Column("next_run_at", DateTime(timezone=True), nullable=True, comment="When the next run is due; NULL once completed."),
    Column("consecutive_errors", Integer, nullable=False, server_default=text("0"), comment="Failed runs since the last success."),
    Column("last_error", Text, nullable=True, comment="Type and text of the last failed run's error."),
    Column("last_status", Text, nullable=True, comment="Outcome of the last finished run (an agora.runs status)."),
    Column("last_started_at", DateTime(timezone=True), nullable=True, comment="When the last run started."),
    Column("last_finished_at", DateTime(timezone=True), nullable=True, comment="When the last run finished."),
    Column("error_backoff_seconds", Float, nullable=False, server_default=text("60"), comment="Base of the exponential delay after a failed run."),
    Column("max_consecutive_errors", Integer, nullable=False, server_default=text("10"), comment="Failed runs in a row after which the schedule stops."),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()"), comment="When the pipeline was first registered."),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()"), comment="When a worker last registered it."),
    Column("job_kind", Text, nullable=True, comment="A periodic job's kind: each tick enqueues one job of it. NULL: the schedule runs a pipeline."),
    Column("declared_at", DateTime(timezone=True), nullable=False, server_default=text("now()"), comment="When a live process last declared the schedule (registered it, or its scheduler read it: at most every 10 s); 120 s without one: orphaned."),
    CheckConstraint("schedule_kind IN ('every', 'cron', 'continuous', 'once')", name="schedules_kind_check"),
    CheckConstraint("state IN ('active', 'paused', 'stopped', 'completed')", name="schedules_state_check"),
    comment="One row per schedule (a pipeline's or a periodic job's): its durable state.",
)

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("pipeline_id", Text, primary_key=True, comment="The pipeline whose source position this is."),
    Column("position", JSONB, nullable=False, comment="Where the next run resumes: a CSV row count, a SQL key, ..."),
    Column("source", Text, nullable=False, comment="Which source the position belongs to (a changed source starts over)."),
    Column("run_id", BigInteger, nullable=True, comment="The agora.runs row of the run that saved it."),
    Column("job_id", BigInteger, nullable=True, comment="The agora.jobs row of the run that saved it."),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()"), comment="When it was saved."),
    comment="The position of each resumable pipeline source, saved with (or right after) each written batch.",
)

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("pipeline_id", Text, nullable=False, comment="The pipeline that rejected the record."),
    Column("run_id", BigInteger, nullable=True, comment="The agora.runs row of that run."),
    Column("job_id", BigInteger, nullable=True, comment="The agora.jobs row of the run that rejected the record."),
    Column("stage", Text, nullable=False, comment="Which step or sink rejected it, e.g. 'map:parse' or 'sink:database'."),
    Column("record", JSONB, nullable=False, comment="The record as the stage received it."),
    Column("error_type", Text, nullable=False, comment="Class name of the error."),
    Column("error_message", Text, nullable=False, comment="Text of the error."),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()"), comment="When it was rejected."),
    Column("replayed_at", DateTime(timezone=True), nullable=True, comment="When agora-pg dlq replay wrote it successfully; NULL while waiting."),
    comment="Records a pipeline step or sink rejected, kept for inspection and replay.",
)
Index(
    "dead_letters_waiting_idx",
    dead_letters.c.pipeline_id,
    dead_letters.c.id,
    postgresql_where=text("replayed_at IS NULL"),
)

workers = Table(
    "workers",
    metadata,
    Column("id", Text, primary_key=True, comment="Unique per process start; never reused."),
    Column("hostname", Text, nullable=False, comment="Host the worker runs on."),
    Column("pid", Integer, nullable=False, comment="Operating-system process id."),
    Column("queues", ARRAY(Text), nullable=False, server_default=text("'{default}'::text[]"), comment="Queues the worker takes jobs from."),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=text("now()"), comment="When the worker started."),
    Column("last_heartbeat_at", DateTime(timezone=True), nullable=False, server_default=text("now()"), comment="Last sign of life."),
    Column("stopped_at", DateTime(timezone=True), nullable=True, comment="When the worker stopped cleanly; NULL while running or after a crash."),
    Column("lease_expires_at", DateTime(timezone=True), nullable=True, comment="Until when the worker's running jobs are its own (renewed by its lease supervisor); after this, other workers rescue them. NULL: the worker holds no worker lease."),
    Column("kinds", ARRAY(Text), nullable=True, comment="The job kinds the worker handles; NULL: not known (a worker of an earlier version)."),
    Column("kind_options", JSONB, nullable=True, comment="The options this worker declared for each of its kinds ({kind: {queue, max_retries, timeout_seconds, retry_backoff_seconds}}); NULL: none."),
    comment="Worker processes and their heartbeats.",
)

kinds = Table(
    "kinds",
    metadata,
    Column("kind", Text, primary_key=True, comment="The job kind."),
    Column("queue", Text, nullable=True, comment="The queue a job of the kind goes to when its enqueue names none; NULL: 'default'."),
    Column("max_retries", Integer, nullable=True, comment="Failed attempts after which its jobs stay failed; NULL: the worker's WORKER_MAX_RETRIES."),
    Column("timeout_seconds", Float, nullable=True, comment="Seconds an attempt may run; NULL: the worker's WORKER_JOB_TIMEOUT."),
    Column("retry_backoff_seconds", Float, nullable=True, comment="Base of the retry delay; NULL: the worker's WORKER_RETRY_BACKOFF_SECONDS."),
    Column("declared_by", Text, nullable=False, comment="The worker whose declaration this is (agora.workers.id): the latest to start wins."),
    Column("declared_at", DateTime(timezone=True), nullable=False, server_default=text("now()"), comment="When it was declared."),
    comment="Each kind's options, as its workers declare them; every producer applies them at enqueue.",
)

kind_limits = Table(
    "kind_limits",
    metadata,
    Column("kind", Text, primary_key=True, comment="The job kind limited."),
    Column("concurrency", Integer, nullable=True, comment="At most this many of the kind's jobs (or of each key's) run at once, across every worker; NULL: no concurrency limit."),
    Column("limit_by", Text, nullable=True, comment="Payload field whose value is the key each limit counts apart; NULL: the kind as a whole."),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()"), comment="When a worker last declared the limit."),
    Column("rate", Integer, nullable=True, comment="At most this many of the kind's jobs (or of each key's) start in any rate_seconds; NULL: no rate limit."),
    Column("rate_seconds", Float, nullable=True, comment="The window of the rate limit, in seconds."),
    Column("fair_by", Text, nullable=True, comment="Payload field whose value is the key the kind's jobs are shared by, one per key in turn; NULL: limit_by's key, if any."),
    CheckConstraint("concurrency > 0", name="kind_limits_concurrency_positive"),
    CheckConstraint("limit_by IS NULL OR limit_by <> ''", name="kind_limits_limit_by_not_empty"),
    CheckConstraint("(rate IS NULL) = (rate_seconds IS NULL) AND (rate IS NULL OR (rate > 0 AND rate_seconds > 0))",
                    name="kind_limits_rate_positive"),
    CheckConstraint("concurrency IS NOT NULL OR rate IS NOT NULL OR fair_by IS NOT NULL", name="kind_limits_some_limit"),
    Column("declared_in", Text, nullable=False, server_default=text("'code'"), comment="Where the limits were declared: 'code' (handlers.kind) or 'config' (an agora/v1 [kinds.NAME] table, which a code declaration leaves alone)."),
    CheckConstraint("fair_by IS NULL OR fair_by <> ''", name="kind_limits_fair_by_not_empty"),
    CheckConstraint("declared_in IN ('code', 'config')", name="kind_limits_declared_in_known"),
    CheckConstraint("(concurrency IS NULL OR concurrency <= 1000000) AND (rate IS NULL OR (rate <= 1000000 AND "
                    "rate_seconds BETWEEN 0.001 AND 86400)) AND (limit_by IS NULL OR length(limit_by) <= 200) "
                    "AND (fair_by IS NULL OR length(fair_by) <= 200)", name="kind_limits_within_bounds"),
    comment="Flow control of job kinds (concurrency and rate limits, fair share), declared by the workers that handle them or by an agora/v1 config.",
)

kind_starts = Table(
    "kind_starts",
    metadata,
    Column("kind", Text, nullable=False, comment="The rate-limited kind."),
    Column("key", Text, nullable=False, comment="The key its limit counted (see kind_limits.limit_by)."),
    Column("started_at", DateTime(timezone=True), nullable=False, comment="When the claim started the job."),
    comment="Starts of rate-limited kinds' jobs within their window (older ones are deleted by the claims).",
)
Index("kind_starts_key_idx", kind_starts.c.kind, kind_starts.c.key, kind_starts.c.started_at)

process_tallies = Table(
    "process_tallies",
    metadata,
    Column("process_id", Text, primary_key=True,
           comment="host:pid:token of a worker process, or '(retired)': the sum of processes gone quiet"),
    Column("tallies", JSONB, nullable=False,
           comment="The process's counters and histogram buckets since it started (process_metrics.snapshot)"),
    Column("published_at", DateTime(timezone=True), nullable=False, server_default=text("now()"),
           comment="When the process last published them (every 10 s while it runs)"),
    comment="Counters of worker processes for the API's /metrics; a process silent for 10 minutes is "
            "folded into the '(retired)' row, so that the sums never go down.",
)

queue_limits = Table(
    "queue_limits",
    metadata,
    Column("queue", Text, primary_key=True, comment="The limited queue."),
    Column("concurrency", Integer, nullable=True,
           comment="At most this many of the queue's jobs run at once, across every worker; NULL: no "
                   "concurrency limit."),
    Column("rate", Integer, nullable=True,
           comment="At most this many of the queue's jobs start in any rate_seconds; NULL: no rate limit."),
    Column("rate_seconds", Float, nullable=True, comment="The window of the rate limit, in seconds."),
    Column("declared_in", Text, nullable=False, server_default=text("'code'"),
           comment="Where the limit was declared: 'code' (handlers.queue) or 'config' (an agora/v1 "
                   "[queues.NAME] table, which a code declaration leaves alone)."),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()"),
           comment="When the limit was last declared differently."),
    CheckConstraint("concurrency >= 1", name="queue_limits_concurrency_positive"),
    CheckConstraint("(rate IS NULL) = (rate_seconds IS NULL) AND (rate IS NULL OR (rate > 0 AND rate_seconds > 0))",
                    name="queue_limits_rate_positive"),
    CheckConstraint("concurrency IS NOT NULL OR rate IS NOT NULL", name="queue_limits_some_limit"),
    CheckConstraint("declared_in IN ('code', 'config')", name="queue_limits_declared_in_known"),
    CheckConstraint("(concurrency IS NULL OR concurrency <= 1000000) AND (rate IS NULL OR (rate <= 1000000 AND "
                    "rate_seconds BETWEEN 0.001 AND 86400)) AND length(queue) <= 100", name="queue_limits_within_bounds"),
    comment="Concurrency and rate limits of queues, declared by the workers that claim them or by an agora/v1 "
            "config.",
)

queue_starts = Table(
    "queue_starts",
    metadata,
    Column("queue", Text, nullable=False, comment="The rate-limited queue."),
    Column("started_at", DateTime(timezone=True), nullable=False,
           comment="When the claim started the job: the database's clock once the claim held its locks, the "
                   "instant its counts used."),
    comment="Starts of rate-limited queues' jobs within their window (older ones are deleted by the claims).",
)
Index("queue_starts_queue_idx", queue_starts.c.queue, queue_starts.c.started_at)
