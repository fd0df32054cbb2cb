"""Hostile input to the tuning-database service, run for real (uvicorn on 127.0.0.1, SQLite and PostgreSQL):
JSON nested far too deep and NUL characters are 422 answers with the usual validation-error body, the same
on both backends, and the OpenAPI document describes the error answers the service really sends."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import jsonschema_rs
import pytest

from live_service import serving
from tvmsched.tuning_db.schemas import MAX_JSON_DEPTH

TOKEN = "hostile-input-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEEP = 100_000


def nested(depth: int) -> str:
    """A JSON array nested ``depth`` levels deep."""
    return "[" * depth + "]" * depth


def record_body(workload_id: int, **changes) -> dict:
    body = {
        "workload_id": workload_id, "target_json": json.dumps({"kind": "llvm"}), "units": 2,
        "unit_kind": "cpu_thread", "trace_json": "[]", "run_secs": [0.001], "blocks": None, "args_info_json": "[]",
    }
    return {**body, **changes}


def assert_validation_error(answer: httpx.Response, *fragments: str) -> dict:
    """A 422 with the service's validation-error body: a one-line detail and the error list, no echo."""
    assert answer.status_code == 422, answer.text[:300]
    assert answer.headers["content-type"] == "application/json"
    assert len(answer.content) < 20_000  # the input is never echoed back
    body = answer.json()
    assert set(body) == {"detail", "errors"}, body
    assert body["detail"].startswith("invalid request: ") and "\n" not in body["detail"]
    assert body["errors"] and all(set(err) == {"loc", "msg", "type"} for err in body["errors"]), body
    for fragment in fragments:
        assert fragment in body["detail"], (fragment, body["detail"])
    return body


@pytest.fixture()
def live(db_url: str) -> Iterator[tuple[str, object, int]]:
    """(service URL, store, id of a stored workload) on each backend."""
    with serving(db_url, token=TOKEN) as (url, store):
        answer = httpx.post(f"{url}/workloads", json={"shash": "1", "mod_json": "{}"}, headers=AUTH)
        assert answer.status_code == 201, answer.text
        yield url, store, answer.json()["id"]


# --- JSON nesting -----------------------------------------------------------------------------------


def test_json_nested_100000_deep_is_a_422(live):
    url, store, workload_id = live
    before = store.stats()
    deep = nested(DEEP)
    requests = [
        ("/workloads", {"shash": "2", "mod_json": deep}, "body.mod_json"),
        ("/workloads/find", {"shash": "2", "mod_json": deep}, "body.mod_json"),
        ("/records", record_body(workload_id, trace_json=deep), "body.trace_json"),
        ("/records", record_body(workload_id, args_info_json=deep), "body.args_info_json"),
        ("/records", record_body(workload_id, target_json=nested(30_000)), "body.target_json"),
    ]
    for path, body, where in requests:
        assert_validation_error(httpx.post(f"{url}{path}", json=body, headers=AUTH, timeout=60), where, "nested deeper")
    # the unauthenticated read, with no token at all
    assert_validation_error(httpx.post(f"{url}/workloads/find", json={"shash": "2", "mod_json": deep}, timeout=60),
                            "body.mod_json", "nested deeper")
    # the request body itself nested too deep
    raw = ('{"shash": "2", "mod_json": "{}", "description": ' + deep + "}").encode()
    for path in ("/workloads", "/workloads/find"):
        headers = {**AUTH, "Content-Type": "application/json"}
        answer = httpx.post(f"{url}{path}", content=raw, headers=headers, timeout=60)
        assert_validation_error(answer, "body", "nested deeper")
    assert httpx.get(f"{url}/health").status_code == 200
    assert store.stats() == before


def test_json_depth_limit_is_exact(live):
    url, store, workload_id = live
    at_limit = httpx.post(f"{url}/workloads", json={"shash": "3", "mod_json": nested(MAX_JSON_DEPTH)}, headers=AUTH)
    assert at_limit.status_code == 201, at_limit.text[:300]
    found = httpx.post(f"{url}/workloads/find", json={"shash": "3", "mod_json": nested(MAX_JSON_DEPTH)})
    assert found.status_code == 200 and found.json()["id"] == at_limit.json()["id"]
    over = httpx.post(f"{url}/workloads", json={"shash": "3", "mod_json": nested(MAX_JSON_DEPTH + 1)}, headers=AUTH)
    assert_validation_error(over, "body.mod_json", f"nested deeper than {MAX_JSON_DEPTH}")
    # brackets inside JSON strings are text, not nesting
    texty = json.dumps({"s": "[" * (10 * MAX_JSON_DEPTH)})
    answer = httpx.post(f"{url}/records", json=record_body(workload_id, trace_json=texty), headers=AUTH)
    assert answer.status_code == 201, answer.text[:300]


# --- NUL characters ---------------------------------------------------------------------------------


def _nul_requests(workload_id: int) -> list[tuple[str, str, dict]]:
    """(method, path, httpx kwargs) with a NUL in one string field or query parameter each."""
    workload = {"shash": "4", "mod_json": "{}", "description": "d"}
    posts = [
        ("/workloads", {**workload, "shash": "4\x00"}),
        ("/workloads", {**workload, "mod_json": '{"a": "\x00"}'}),
        ("/workloads", {**workload, "description": "nul \x00 here"}),
        ("/workloads/find", {"shash": "\x00"}),
        ("/workloads/find", {"shash": "4", "mod_json": '"\x00"'}),
        ("/records", record_body(workload_id, target_json='{"kind": "llvm\x00"}')),
        ("/records", record_body(workload_id, trace_json='["\x00"]')),
        ("/records", record_body(workload_id, args_info_json='"\x00"')),
    ]  # unit_kind is an enum: any other text is refused
    gets = [
        ("/workloads/lookup", {"shash": "4\x00"}),
        ("/records/top", {"workload_id": workload_id, "k": 1, "target_hash": "ab\x00"}),
    ]
    return [("POST", path, {"json": body}) for path, body in posts] + [("GET", path, {"params": q}) for path, q in gets]


def test_nul_characters_are_refused_identically_on_both_backends(tmp_path, pg_url):
    answers = {}
    for backend, db_url in (("sqlite", f"sqlite:///{tmp_path / 'tuning.db'}"), ("postgresql", pg_url)):
        with serving(db_url, token=TOKEN) as (url, store):
            created = httpx.post(f"{url}/workloads", json={"shash": "1", "mod_json": "{}"}, headers=AUTH)
            workload_id = created.json()["id"]
            answers[backend] = []
            for method, path, kwargs in _nul_requests(workload_id):
                answer = httpx.request(method, f"{url}{path}", headers=AUTH, **kwargs)
                body = assert_validation_error(answer, "NUL")
                answers[backend].append((method, path, body))
            assert store.stats() == {"workloads": 1, "records": 0}
            assert httpx.get(f"{url}/health").status_code == 200
    assert answers["sqlite"] == answers["postgresql"]


# --- the OpenAPI document ---------------------------------------------------------------------------


def _resolve(spec: dict, schema: dict) -> dict:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _response_schema(spec: dict, method: str, path: str, status: int) -> dict:
    responses = spec["paths"][path][method.lower()]["responses"]
    assert str(status) in responses, (method, path, status, sorted(responses))
    return responses[str(status)]["content"]["application/json"]["schema"]


def _validate(spec: dict, method: str, path: str, answer: httpx.Response) -> None:
    """The answer's body conforms to the schema the document gives for its status."""
    schema = _response_schema(spec, method, path, answer.status_code)
    jsonschema_rs.validate({**schema, "components": spec["components"]}, answer.json())


def test_openapi_documents_the_answers_the_service_sends(tmp_path):
    with serving(f"sqlite:///{tmp_path / 'tuning.db'}", token=TOKEN) as (url, _):
        spec = httpx.get(f"{url}/openapi.json").json()
        operations = [(method.upper(), path) for path, item in spec["paths"].items() for method in item]
        validated = [("POST", "/workloads"), ("POST", "/workloads/find"), ("POST", "/records"),
                     ("GET", "/workloads/lookup"), ("GET", "/workloads/{workload_id}"), ("GET", "/records/top")]
        for method, path in validated:
            error = _resolve(spec, _response_schema(spec, method, path, 422))
            assert set(error["required"]) == {"detail", "errors"}, (method, path, error)
            assert error["properties"]["detail"]["type"] == "string"
            item = _resolve(spec, error["properties"]["errors"]["items"])
            assert set(item["required"]) == {"loc", "msg", "type"}
        assert "HTTPValidationError" not in spec["components"]["schemas"]  # FastAPI's shape is not what is sent
        for method, path in operations:  # any request can carry a body the service cannot read
            assert "400" in spec["paths"][path][method.lower()]["responses"], (method, path)
        for path in ("/workloads", "/records"):
            unauthorized = spec["paths"][path]["post"]["responses"]["401"]
            assert "WWW-Authenticate" in unauthorized["headers"]

        # and the answers conform to it
        answers = [
            ("POST", "/workloads", httpx.post(f"{url}/workloads", json={"shash": "1", "mod_json": "{}"})),  # 401
            ("POST", "/records", httpx.post(f"{url}/records", json={}, headers={"Authorization": "Bearer no"})),  # 401
            ("POST", "/workloads", httpx.post(f"{url}/workloads", json={"shash": 1}, headers=AUTH)),  # 422
            ("POST", "/workloads/find", httpx.post(f"{url}/workloads/find", content=b"{not json",
                                                   headers={"Content-Type": "application/json"})),  # 422
            ("POST", "/workloads/find", httpx.post(f"{url}/workloads/find", content=b'{"shash": "\xff"}',
                                                   headers={"Content-Type": "application/json"})),  # 400
            ("GET", "/records/top", httpx.get(f"{url}/records/top", params={"k": "x"})),  # 422
            ("GET", "/workloads/{workload_id}", httpx.get(f"{url}/workloads/0")),  # 422
            ("GET", "/workloads/{workload_id}", httpx.get(f"{url}/workloads/7")),  # 404
        ]
        assert sorted({a.status_code for _, _, a in answers}) == [400, 401, 404, 422]
        for method, path, answer in answers:
            _validate(spec, method, path, answer)


def test_405_lists_every_method_of_the_path(tmp_path):
    with serving(f"sqlite:///{tmp_path / 'tuning.db'}", token=TOKEN) as (url, _):
        for method, path, allowed in (("OPTIONS", "/workloads", "GET, POST"), ("DELETE", "/records", "GET, POST"),
                                      ("PUT", "/health", "GET"), ("POST", "/workloads/lookup", "GET"),
                                      ("DELETE", "/workloads/5", "GET")):
            answer = httpx.request(method, f"{url}{path}", headers=AUTH)
            assert answer.status_code == 405, (method, path, answer.text)
            assert answer.headers["allow"] == allowed, (method, path)
            assert answer.json() == {"detail": "Method Not Allowed"}
