-- Calls whose rows could not be written (log locked, disk full, file removed), recorded once
-- the log is writable again, so the summary can say how many calls it is missing.
CREATE TABLE log_gap (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    first_ts    REAL    NOT NULL,
    last_ts     REAL    NOT NULL,
    missed      INTEGER NOT NULL CHECK (missed > 0),
    last_error  TEXT    NOT NULL
);
