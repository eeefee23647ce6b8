-- Success callbacks owed: a row is written in the same statement that records the success, and
-- a sender loop in every process delivers it (at least once, with back-off, bounded tries).
-- state: 0 owed, 2 given up (visible in stats); delivered rows are deleted.

CREATE TABLE IF NOT EXISTS asynch_callback (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id     TEXT        NOT NULL,
    url         TEXT        NOT NULL,
    params      JSON        NOT NULL,  -- JSON keeps the order of the query parameters
    state       SMALLINT    NOT NULL DEFAULT 0,
    attempts    INTEGER     NOT NULL DEFAULT 0,
    next_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_error  TEXT,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS asynch_callback_due_idx ON asynch_callback (next_at) WHERE state = 0;
