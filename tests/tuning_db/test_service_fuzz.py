"""Property-based fuzzing of the tuning-database service from its own OpenAPI document (schemathesis).

A real service (uvicorn on 127.0.0.1, in a thread) on SQLite and on PostgreSQL, serving the document the
tests generate from (test_the_live_service_serves_this_document); schemathesis sends generated requests,
valid and invalid, to every operation, each request to both services. Each answer must not be a 5xx and
must conform to the document: a documented status code, content type, headers and body schema; valid
requests accepted, invalid ones refused; secured writes refused without the token; ``Allow`` right on 405. Examples are bounded and
seeded (the same cases every run), so the test stays short and reproducible.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.config import SchemathesisConfig

from live_service import serving
from tvmsched.tuning_db.service import create_app

TOKEN = "fuzz-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_EXAMPLES = 12  # per operation, in the fuzzing phase (30: 52 s against 25 on 2 cores, the same checks)
SEED = 20240611


@pytest.fixture(scope="module")
def sqlite_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a token-protected service on SQLite holding one workload and one record."""
    yield from _serve(f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'tuning.db'}")


@pytest.fixture(scope="module")
def postgresql_service(pg_admin_url: str) -> Iterator[str]:
    """Base URL of a token-protected service on PostgreSQL holding one workload and one record."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"fuzz_{uuid.uuid4().hex[:12]}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield from _serve(make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False))
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fuzzed_service(request: pytest.FixtureRequest) -> str:
    """Base URL of the service on each backend."""
    return request.getfixturevalue(f"{request.param}_service")


@pytest.fixture(scope="module")
def fuzzed_services(sqlite_service: str, postgresql_service: str) -> dict[str, str]:
    """{backend: base URL}: the services on both backends, which the fuzzing sends each case to."""
    return {"sqlite": sqlite_service, "postgresql": postgresql_service}


def _serve(db_url: str) -> Iterator[str]:
    with serving(db_url, token=TOKEN) as (url, _):
        workload = httpx.post(f"{url}/workloads", json={"shash": "1", "mod_json": "{}"}, headers=AUTH)
        assert workload.status_code == 201, workload.text
        record = {"workload_id": workload.json()["id"], "target_json": '{"kind": "llvm"}', "units": 1,
                  "unit_kind": "cpu_thread", "trace_json": "[]", "run_secs": [0.001], "args_info_json": "[]"}
        assert httpx.post(f"{url}/records", json=record, headers=AUTH).status_code == 201
        yield url


class _NoStore:
    """Enough of a store to build the app whose OpenAPI document drives the generation (no database)."""

    url = "sqlite://"


# The *_json fields hold JSON text: the document says so with contentMediaType "application/json", which
# JSON Schema 2020-12 (OpenAPI 3.1) treats as an annotation, so schemathesis would draw any text for them and
# take the service's 422 for a valid request refused. For generation only, those fields get a test-local
# format whose strategy draws JSON text (the responses are still checked against the served document).
JSON_TEXT_FORMAT = "tvmsched-test-json-text"
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)
schemathesis.openapi.format(JSON_TEXT_FORMAT, _json_values.map(json.dumps))


def _for_generation(document: dict) -> dict:
    """A copy of ``document`` whose JSON-text string schemas carry JSON_TEXT_FORMAT."""
    document = copy.deepcopy(document)
    stack: list = [document]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "string" and node.get("contentMediaType") == "application/json":
                node["format"] = JSON_TEXT_FORMAT
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return document


# The document comes from the app itself; test_the_live_service_serves_this_document checks that the running
# service serves the same.
DOCUMENT = create_app(_NoStore(), token=TOKEN).openapi()
CONFIG = SchemathesisConfig.from_dict({
    "seed": SEED,
    # The coverage phase draws boundary strings ("000") for a JSON-text field inside anyOf (the optional
    # mod_json of /workloads/find) without its format, so there only the fuzzing phase checks that valid
    # requests are accepted.
    "operations": [{"include-path": "/workloads/find", "include-method": "POST",
                    "phases": {"coverage": {"checks": {"positive_data_acceptance": {"enabled": False}}}}}],
})


def _integer_fields(document: dict) -> set[str]:
    """Names of the integer properties of the request bodies."""
    bodies = {operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
              for item in document["paths"].values() for operation in item.values() if "requestBody" in operation}
    names = set()
    for body in bodies:
        for prop, prop_schema in document["components"]["schemas"][body].get("properties", {}).items():
            types = [prop_schema.get("type")] + [option.get("type") for option in prop_schema.get("anyOf", [])]
            if "integer" in types:
                names.add(prop)
    return names


INTEGER_FIELDS = _integer_fields(DOCUMENT)


def _integers_without_a_fraction(context, body):
    """Write whole numbers drawn for integer fields as integers: ``2`` rather than ``2.0``.

    JSON Schema cannot tell the two apart (both are the integer 2), but request bodies are strict and take
    only the first (the document's description says so). Either spelling is equally valid or invalid for the
    schema, so this changes no case from valid to invalid or back.
    """
    if isinstance(body, dict):
        for name in INTEGER_FIELDS & body.keys():
            if isinstance(body[name], float) and body[name].is_integer():
                body[name] = int(body[name])
    return body


@pytest.fixture
def service_schema(request: pytest.FixtureRequest):
    """The schema that drives the generation, loaded when the fuzzing test runs (schemathesis builds each
    operation's coverage cases from it then, ~20 s of CPU): a schema loaded at import would have them built at
    collection, in every pytest-xdist worker, for the one worker that runs this module."""
    # schemathesis 4.32's lazy schemas name each operation's subtest by rewriting the item's `_nodeid`, which
    # pytest 9.2's nodes no longer have (their id is `_id`, read through `nodeid`): it reads it first, so it
    # gets one (the subtests' reports name the operations through their labels).
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid
    schema = schemathesis.openapi.from_dict(_for_generation(DOCUMENT), config=CONFIG)
    schema.hook("map_body")(_integers_without_a_fraction)
    return schema


schema = schemathesis.pytest.from_fixture("service_schema")


def test_the_live_service_serves_this_document(fuzzed_service):
    assert httpx.get(f"{fuzzed_service}/openapi.json").json() == DOCUMENT


# Each operation is one subtest (reported with label="'METHOD /path'"); each of its cases goes to the service on both
# backends, so that the cases are built once for the two (the same cases each backend got as a test of its own).
@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
def test_the_service_conforms_to_its_openapi_document(case, fuzzed_services):
    for backend, url in fuzzed_services.items():
        try:
            case.call_and_validate(base_url=url, headers=AUTH, timeout=60)
        except Exception as error:
            error.add_note(f"(the service on {backend})")
            raise
