-- The initial schema of a Warren store: every table the gateway replicas share.

CREATE TABLE events (
    session_id text NOT NULL,
    seq bigint NOT NULL CHECK (seq >= 1),
    kind text NOT NULL,
    body text NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE sessions (
    id text PRIMARY KEY,
    device_id text NOT NULL,
    meta jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sessions_device_id ON sessions (device_id);

CREATE TABLE devices (
    id text PRIMARY KEY,
    record jsonb NOT NULL
);

CREATE TABLE preview_tokens (
    token_hash text PRIMARY KEY,
    session_id text NOT NULL,
    record jsonb NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX preview_tokens_session_id ON preview_tokens (session_id);

-- `took_over_from` is written by the same upsert that takes an expired lease (the replica whose
-- lease it was), so the taker learns it from RETURNING without a second, racy read.
-- A released lease keeps its row with `expires_at = '-infinity'`, so epochs never restart.
CREATE TABLE leases (
    session_id text PRIMARY KEY,
    replica_id text NOT NULL,
    replica_url text NOT NULL,
    epoch bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    took_over_from text
);

CREATE TABLE brain_slots (
    session_id text PRIMARY KEY,
    device_id text NOT NULL,
    replica_id text NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX brain_slots_device_id ON brain_slots (device_id);
CREATE INDEX brain_slots_replica_id ON brain_slots (replica_id);
