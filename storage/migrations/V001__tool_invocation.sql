-- One row per MCP tool call, committed before the call's response is sent.
CREATE TABLE tool_invocation (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    ts                REAL    NOT NULL,             -- unix seconds (UTC)
    session_key       TEXT,                         -- null when no session could be identified
    session_scope     TEXT    NOT NULL,             -- explicit / mcp-session / connection / none
    tool_name         TEXT    NOT NULL,
    query             TEXT,                         -- the query, or "sha256:<16 hex>" when log_queries is off
    domain_filter     TEXT,
    missing_dimension TEXT,
    relevance_level   TEXT,
    dedup_reason      TEXT,
    completeness_hint TEXT,
    water_level       TEXT,
    next_call         TEXT,
    call_index        INTEGER,                      -- the session's nth lookup
    result_doc_keys   TEXT    NOT NULL DEFAULT '[]' CHECK (json_valid(result_doc_keys)),
    retrieval_details TEXT             CHECK (retrieval_details IS NULL OR json_valid(retrieval_details)),
    latency_ms        REAL    NOT NULL,
    error             TEXT
);

CREATE INDEX tool_invocation_ts ON tool_invocation (ts);
CREATE INDEX tool_invocation_session ON tool_invocation (session_key, ts);
