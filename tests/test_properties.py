"""Property-based tests over the tool arguments: no input crashes the server or corrupts a session's memory.

A hypothesis state machine drives three explicit sessions of one in-process server with arbitrary
arguments (wrong types, control characters, lone surrogates, filter syntax, unknown keys) mixed
with real lookups and resets. A model on the test side tracks what each session was given, and
after every call the server's answer must agree with it:
- no document is returned twice to a session;
- ``already_in_context`` lists only documents this session was given;
- ``retrieved_domains_this_session`` is exactly the domains of those documents;
- ``budget.calls_used`` counts this session's answered lookups, and a refused call counts nothing.
Between steps a probe lookup in a fresh session must still be answered.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from anyio.from_thread import BlockingPortal
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from mcp import Client

from tests.helpers import ROOT
from tests.wire import blocking_client, private_data_dir

pytestmark = pytest.mark.slow

DOMAINS = ["api", "error-codes", "infrastructure", "onboarding", "troubleshooting"]
REAL_QUERIES = [
    json.loads(line)["query"]
    for line in (ROOT / "examples/calibration/queries.jsonl").read_text(encoding="utf-8").splitlines()[:24]
]
PROBE_QUERY = "ERR_TIMEOUT 是什么"
ERROR_PREFIX = "Error executing tool lookup_knowledge: "

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
awkward_characters = st.sampled_from(
    ["\x00", "\x1b", "\x7f", "\x85", "\ud800", "\udfff", "\u200b", "\ufeff", "\\", '"', "'", "\n", " "]
)
awkward_text = st.text(alphabet=st.characters() | awkward_characters, max_size=40)
filter_syntax = st.sampled_from(
    ['" or 1==1 or "', 'api" || domain != "', "\\", '\\"', "domain in ['api']", "api' --"]
)

queries = (
    st.sampled_from(REAL_QUERIES)
    | awkward_text
    | st.text(min_size=1990, max_size=2010, alphabet="ab ")
    | json_values
)
domains = st.none() | st.sampled_from(DOMAINS) | filter_syntax | awkward_text | json_values
top_ks = (
    st.integers(-3, 15)
    | st.floats(allow_nan=True)
    | st.sampled_from(["3", True, None, 10**9, 1e9])
    | json_values
)
dimensions = st.none() | awkward_text | st.text(min_size=495, max_size=505, alphabet="xy") | json_values
arguments = (
    st.fixed_dictionaries(
        {},
        optional={"query": queries, "domain": domains, "top_k": top_ks, "missing_dimension": dimensions},
    )
    | st.fixed_dictionaries(
        {"query": st.sampled_from(REAL_QUERIES)},
        optional={
            "domain": st.sampled_from(DOMAINS),
            "top_k": st.integers(1, 10),
            "missing_dimension": awkward_text,
        },
    )
    | st.dictionaries(st.text(min_size=1, max_size=10), json_values, max_size=3).map(
        lambda extra: {"query": REAL_QUERIES[0], **extra}
    )
)


@pytest.fixture(scope="module")
def in_process(
    tmp_path_factory: pytest.TempPathFactory, sample_template: Path, e5_embedder: Any
) -> Iterator[tuple[BlockingPortal, Client]]:
    data_dir = private_data_dir(sample_template, tmp_path_factory.mktemp("properties") / "data")
    with blocking_client(data_dir, e5_embedder) as (portal, client):
        yield portal, client


class SessionModel:
    """What the test knows one session was given."""

    def __init__(self) -> None:
        self.key = "prop-" + uuid.uuid4().hex[:12]
        self.docs: dict[str, str] = {}  # doc_key -> domain
        self.passages: set[str] = set()  # doc_key#section the session was given
        self.calls = 0


class LookupMachine(RuleBasedStateMachine):
    portal: ClassVar[BlockingPortal]
    client: ClassVar[Client]

    def __init__(self) -> None:
        super().__init__()
        self.sessions = [SessionModel() for _ in range(3)]

    def _call(self, tool: str, args: dict[str, Any], session_key: str) -> Any:
        async def bounded() -> Any:
            with anyio.fail_after(120):
                return await self.client.call_tool(tool, args, meta={"session_id": session_key})

        # Any exception here (a protocol error, a dropped connection) fails the property.
        return self.portal.call(bounded)

    def _lookup(self, session: SessionModel, args: dict[str, Any]) -> None:
        result = self._call("lookup_knowledge", args, session.key)
        if result.is_error:
            assert result.content[0].text.startswith(ERROR_PREFIX), result.content
            event("refused: invalid arguments")
            return
        answer = result.structured_content
        assert answer is not None
        event(f"answered: {answer['relevance_level']}")
        returned = ([answer["primary"]] if answer["primary"] else []) + answer["supplement"]
        keys = [doc["doc_key"] for doc in returned]
        assert len(keys) == len(set(keys))
        passages = {f"{doc['doc_key']}#{section}" for doc in returned for section in doc["sections"] or [""]}
        assert not passages & session.passages, "a passage was sent twice to one session"
        assert {doc["doc_key"] for doc in answer["already_in_context"]} <= set(session.docs)
        session.docs.update({doc["doc_key"]: doc["domain"] for doc in returned})
        session.passages |= passages
        session.calls += 1
        assert sorted(answer["retrieved_domains_this_session"]) == sorted(set(session.docs.values()))
        assert answer["budget"]["calls_used"] == session.calls
        assert answer["session_scope"] == "explicit"

    @rule(index=st.integers(0, 2), args=arguments)
    def arbitrary_lookup(self, index: int, args: dict[str, Any]) -> None:
        self._lookup(self.sessions[index], args)

    @rule(
        index=st.integers(0, 2),
        query=st.sampled_from(REAL_QUERIES),
        domain=st.none() | st.sampled_from(DOMAINS),
    )
    def real_lookup(self, index: int, query: str, domain: str | None) -> None:
        self._lookup(self.sessions[index], {"query": query, "domain": domain})

    @rule(index=st.integers(0, 2))
    def reset(self, index: int) -> None:
        session = self.sessions[index]
        result = self._call("reset_session", {}, session.key)
        assert not result.is_error
        assert result.structured_content["forgotten"] == (session.calls > 0)
        session.docs.clear()
        session.passages.clear()
        session.calls = 0

    @invariant()
    def the_server_still_answers_a_normal_lookup(self) -> None:
        result = self._call("lookup_knowledge", {"query": PROBE_QUERY}, "probe-" + uuid.uuid4().hex[:12])
        assert not result.is_error, result.content
        assert result.structured_content["relevance_level"] == "PRECISE"


def test_no_arguments_crash_the_server_or_corrupt_session_memory(
    in_process: tuple[BlockingPortal, Client],
) -> None:
    LookupMachine.portal, LookupMachine.client = in_process
    run_state_machine_as_test(
        LookupMachine,
        settings=settings(
            max_examples=40,
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ),
    )
