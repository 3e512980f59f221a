-- The latest action memory of each session, so a restart does not hand documents back.
CREATE TABLE session_memory (
    session_key TEXT PRIMARY KEY,
    state       TEXT NOT NULL CHECK (json_valid(state)),  -- domains, titles, counters, next_call
    last_seen   REAL NOT NULL                             -- unix seconds (wall clock)
);

CREATE INDEX session_memory_last_seen ON session_memory (last_seen);
