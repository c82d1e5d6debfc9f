-- Tollgate's policy store (PostgreSQL). Times are Unix epoch milliseconds; JSON is TEXT.
CREATE TABLE policies (
    name        TEXT PRIMARY KEY NOT NULL,
    spec        TEXT NOT NULL,
    apps        TEXT NOT NULL,
    enabled     BIGINT NOT NULL,
    version     BIGINT NOT NULL,
    created_by  TEXT NOT NULL,
    updated_by  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);

CREATE TABLE consumer_limits (
    id          TEXT PRIMARY KEY NOT NULL,
    consumer_id TEXT NOT NULL,
    scope       TEXT,
    per_second  BIGINT NOT NULL,
    per_minute  BIGINT NOT NULL,
    per_hour    BIGINT NOT NULL,
    per_day     BIGINT NOT NULL,
    per_week    BIGINT NOT NULL,
    per_month   BIGINT NOT NULL,
    active_from BIGINT,
    active_to   BIGINT,
    version     BIGINT NOT NULL,
    created_by  TEXT NOT NULL,
    updated_by  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);
CREATE INDEX consumer_limits_by_consumer ON consumer_limits (consumer_id);

CREATE TABLE tokens (
    name        TEXT PRIMARY KEY NOT NULL,
    hash        TEXT NOT NULL UNIQUE,
    role        TEXT NOT NULL,
    apps        TEXT,
    created_by  TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE TABLE audit_log (
    id          BIGSERIAL PRIMARY KEY,
    at          BIGINT NOT NULL,
    actor       TEXT NOT NULL,
    action      TEXT NOT NULL,
    kind        TEXT NOT NULL,
    subject     TEXT NOT NULL,
    before_json TEXT,
    after_json  TEXT
);

-- One row: bumped by every change, polled by every instance to know when to reload.
CREATE TABLE revision (
    id       BIGINT PRIMARY KEY NOT NULL,
    revision BIGINT NOT NULL
);
INSERT INTO revision (id, revision) VALUES (1, 0);
