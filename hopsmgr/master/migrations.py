"""The store's schema as numbered migrations, written once in SQLite's dialect (hopsmgr.master.pgstore
translates them for PostgreSQL). A store at version N runs migrations N+1.. in one transaction each;
`SCHEMA_VERSION` is the newest. Never edit a released migration: add one."""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 1: the first schema
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE tenants (
        name TEXT PRIMARY KEY, guaranteed_gpus INTEGER NOT NULL, cap_gpus INTEGER, weight REAL NOT NULL);
    CREATE TABLE tokens (
        hash TEXT PRIMARY KEY, user TEXT NOT NULL, tenant TEXT NOT NULL, admin INTEGER NOT NULL,
        created REAL NOT NULL);
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, tenant TEXT NOT NULL, user TEXT NOT NULL,
        name TEXT NOT NULL, state TEXT NOT NULL, submitted REAL NOT NULL, state_since REAL NOT NULL,
        spec TEXT NOT NULL, command TEXT NOT NULL, env TEXT NOT NULL, workdir TEXT NOT NULL,
        launcher TEXT NOT NULL, done_samples REAL NOT NULL DEFAULT 0, attained_gpu_s REAL NOT NULL DEFAULT 0,
        running_s REAL NOT NULL DEFAULT 0, restarts INTEGER NOT NULL DEFAULT 0,
        preemptions INTEGER NOT NULL DEFAULT 0, node_losses INTEGER NOT NULL DEFAULT 0,
        failures INTEGER NOT NULL DEFAULT 0, reason TEXT, has_checkpoint INTEGER NOT NULL DEFAULT 0,
        ended REAL);
    CREATE INDEX jobs_state ON jobs (state);
    CREATE INDEX jobs_tenant ON jobs (tenant, seq);
    CREATE TABLE attempts (
        id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, job_id TEXT NOT NULL REFERENCES jobs (id),
        placement TEXT NOT NULL, profiling INTEGER NOT NULL, epoch INTEGER NOT NULL, created REAL NOT NULL,
        started REAL, ended REAL, end_reason TEXT, exit_code INTEGER, stopping INTEGER NOT NULL DEFAULT 0,
        resume INTEGER NOT NULL DEFAULT 0, devices TEXT, log_tail TEXT);
    CREATE INDEX attempts_job ON attempts (job_id, seq);
    CREATE INDEX attempts_open ON attempts (ended);
    CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, time REAL NOT NULL, kind TEXT NOT NULL,
        state TEXT, message TEXT NOT NULL DEFAULT '');
    CREATE INDEX events_job ON events (job_id, seq);
    CREATE TABLE nodes (
        id TEXT PRIMARY KEY, gpu_type TEXT NOT NULL, gpus INTEGER NOT NULL, drained INTEGER NOT NULL DEFAULT 0,
        calibration TEXT, calibration_source TEXT NOT NULL DEFAULT '', device_mode TEXT NOT NULL DEFAULT '',
        workdir TEXT NOT NULL DEFAULT '', agent_version TEXT NOT NULL DEFAULT '', last_beat REAL);
    CREATE TABLE throughput (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, time REAL NOT NULL,
        placement TEXT NOT NULL, samples_per_s REAL NOT NULL);
    CREATE TABLE estimator (id INTEGER PRIMARY KEY CHECK (id = 1), state TEXT NOT NULL, saved REAL NOT NULL);
    CREATE TABLE rounds (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, kind TEXT NOT NULL, duration_s REAL NOT NULL,
        solve_s REAL NOT NULL, method TEXT NOT NULL, proven INTEGER NOT NULL, launches INTEGER NOT NULL,
        stops INTEGER NOT NULL, queued INTEGER NOT NULL, running INTEGER NOT NULL, idle_gpus INTEGER NOT NULL);
    """,
    # 2: each profiling run's result, durable with the end of its attempt (the estimator blob is saved
    # only once a round)
    """
    CREATE TABLE profiles (
        job_id TEXT NOT NULL, gpu_type TEXT NOT NULL, profile TEXT NOT NULL, calibration TEXT NOT NULL,
        time REAL NOT NULL, PRIMARY KEY (job_id, gpu_type));
    """,
    # 3: users (identities: tenant, Unix account, role); every token belongs to one. The users of
    # older stores are made from their tokens (a user's first tenant; admin if any token was), and
    # each token gets a public id (a prefix of its hash) to list and revoke it by. Portable SQL only.
    """
    CREATE TABLE users (
        name TEXT PRIMARY KEY, tenant TEXT NOT NULL, unix_user TEXT NOT NULL DEFAULT '',
        role TEXT NOT NULL, created REAL NOT NULL);
    INSERT INTO users (name, tenant, unix_user, role, created)
        SELECT user, MIN(tenant), '', CASE WHEN MAX(admin) = 1 THEN 'admin' ELSE 'user' END, MIN(created)
        FROM tokens GROUP BY user;
    ALTER TABLE tokens ADD COLUMN id TEXT NOT NULL DEFAULT '';
    UPDATE tokens SET id = substr(hash, 1, 16);
    CREATE INDEX tokens_user ON tokens (user);
    """,
    # 4: what a job runs as on the nodes (its submitter's Unix account where jobs run as their users)
    # and the limits of its cgroup (MiB of memory, CPUs); NULL: no limit
    """
    ALTER TABLE jobs ADD COLUMN run_as TEXT NOT NULL DEFAULT '';
    ALTER TABLE jobs ADD COLUMN mem_mb INTEGER;
    ALTER TABLE jobs ADD COLUMN cpus REAL;
    """,
    # 5: beside each measured throughput, what the estimator expected there just before (NULL: no
    # estimate; rows of older stores), so an ended job's history still compares the two
    # (and the job's rows found by index: a job's detail reads them)
    """
    ALTER TABLE throughput ADD COLUMN estimated_per_s REAL;
    CREATE INDEX throughput_job ON throughput (job_id, seq);
    """,
    # 6: a tenant's caps and guarantees per GPU type (JSON objects, GPU type -> GPUs; '{}': none), so
    # the tenants table holds the whole quota the master last started with
    """
    ALTER TABLE tenants ADD COLUMN guaranteed_gpus_by_type TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE tenants ADD COLUMN cap_gpus_by_type TEXT NOT NULL DEFAULT '{}';
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)
