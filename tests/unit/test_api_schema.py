"""schemathesis over the OpenAPI schema the daemon serves: every operation, with a bearer token and a
webhook signing secret configured, must answer without a 5xx, with a documented status code and content
type, and with a body that matches the documented response schema.

The API runs in a real uvicorn server on a loopback port in front of the real services (reconciler over a
fake engine, SqlStore on a temp SQLite file: tests/unit/frontdoor_stack.py). Webhook bodies are signed with
the configured secret, so generated events reach the validation behind the signature check.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from hypothesis.strategies import SearchStrategy
from schemathesis import GenerationMode
from schemathesis.checks import CheckFunction, not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.unit.frontdoor_stack import SECRET, TOKEN, Stack, build_stack
from warmer.core.webhook import SIGNATURE_HEADER, sign_body

CHECKS: list[CheckFunction] = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
CHECKS_DOWN = CHECKS[1:]
DEPLOY_PATH = "/v1/events/deploy"
AGENT, BOX = "sales", "b1"  # the stack's own agent and one of its boxes
CAMPAIGN_ID = "spring-1"
EXAMPLES_PER_MODE = 25  # per operation and generation mode: the whole run stays well under a minute
EXAMPLES_DOWN = 10  # per operation while the database is down
OPERATIONS = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/v1/boxes"),
    ("GET", "/v1/boxes/{box_id}"),
    ("GET", "/v1/boxes/{box_id}/ready"),
    ("GET", "/v1/boxes/{box_id}/admit"),
    ("GET", "/v1/routes"),
    ("GET", "/v1/capacity"),
    ("POST", "/v1/usage"),
    ("GET", "/v1/usage"),
    ("POST", "/v1/prewarm"),
    ("POST", "/v1/boxes/{box_id}/side-slot"),
    ("PUT", "/v1/campaigns/{campaign_id}"),
    ("DELETE", "/v1/campaigns/{campaign_id}"),
    ("GET", "/v1/campaigns"),
    ("POST", DEPLOY_PATH),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServedStack:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            stack.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off", access_log=False
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="schemathesis-api", daemon=True)

    def __enter__(self) -> ServedStack:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the API did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedStack]:
    stack = build_stack(tmp_path_factory.mktemp("schema"))
    with ServedStack(stack) as running:
        yield running


@pytest.fixture(scope="module")
def http(served: ServedStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.base_url, timeout=30) as client:
        yield client


def call_and_validate(
    case: schemathesis.Case, served: ServedStack, http: httpx.Client, checks: list[CheckFunction]
) -> None:
    """Send the case as generated (webhook bodies signed with the configured secret) and run the checks."""
    kwargs = case.as_transport_kwargs(base_url=served.base_url)
    # The schema declares the bearer scheme: whatever credentials were generated give way to the real one.
    generated = (kwargs.get("headers") or {}).items()
    headers = {str(k): str(v) for k, v in generated if str(k).lower() != "authorization"}
    headers["authorization"] = f"Bearer {TOKEN}"
    content: bytes | None = None
    if "json" in kwargs:
        content = json.dumps(kwargs["json"]).encode()
        headers["content-type"] = "application/json"
    elif kwargs.get("data") is not None:
        data = kwargs["data"]
        content = data if isinstance(data, bytes) else str(data).encode()
    if case.operation.path == DEPLOY_PATH:
        headers[SIGNATURE_HEADER] = sign_body(content or b"", SECRET, int(served.stack.clock.now()))
    response = http.request(
        kwargs["method"], kwargs["url"], params=kwargs.get("params"), headers=headers, content=content
    )
    case.validate_response(response, checks=checks, headers=headers)


def naming_the_fleet(case: schemathesis.Case) -> schemathesis.Case:
    """The case with the agent and box it names replaced by ones the daemon has."""
    if isinstance(case.body, dict) and "agent" in case.body:
        case.body["agent"] = AGENT
    if case.path_parameters and "box_id" in case.path_parameters:
        case.path_parameters["box_id"] = BOX
    if case.path_parameters and "campaign_id" in case.path_parameters:
        case.path_parameters["campaign_id"] = CAMPAIGN_ID
    return case


def run_operation(
    operation: schemathesis.APIOperation,
    strategies: list[tuple[GenerationMode, SearchStrategy[schemathesis.Case]]],
    served: ServedStack,
    http: httpx.Client,
    examples: int,
    checks: list[CheckFunction] = CHECKS,
) -> None:
    for mode, strategy in strategies:

        @given(case=strategy)
        @settings(
            max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def check(case: schemathesis.Case) -> None:
            call_and_validate(case, served, http, checks)

        try:
            check()
        except Unsatisfiable:
            # every input of the operation accepts any value of its type (e.g. a free-form path id):
            # schemathesis cannot build an invalid request for it, which is not a failure of the API
            assert mode is GenerationMode.NEGATIVE, f"{operation.method.upper()} {operation.path}"
        except BaseException as exc:
            exc.add_note(f"operation: {operation.method.upper()} {operation.path}, {mode.value} cases")
            raise


@pytest.mark.timeout(300)  # fuzzes every operation: minutes on a busy CI machine, not seconds
def test_every_operation_answers_as_documented(served: ServedStack, http: httpx.Client) -> None:
    schema = schemathesis.openapi.from_url(f"{served.base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {(op.method.upper(), op.path) for op in operations} == OPERATIONS
    for operation in operations:
        takes_input = bool(operation.body) or any(True for _ in operation.iter_parameters())
        # nothing to make invalid in an operation without inputs: positive cases only
        modes = (
            (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if takes_input else (GenerationMode.POSITIVE,)
        )
        strategies = [(mode, operation.as_strategy(generation_mode=mode)) for mode in modes]
        # random names are nearly always unknown (404/422 early): also send valid cases naming the fleet's
        # own agent and box, so generated values reach the code behind those checks
        strategies.append((GenerationMode.POSITIVE, operation.as_strategy().map(naming_the_fleet)))
        run_operation(operation, strategies, served, http, EXAMPLES_PER_MODE)
    # and with the database down: the documented 503 is expected now, so a 5xx is not a failure by itself,
    # but any status code, content type or body the schema does not document still is (a 500 among them)
    served.stack.store.down = True
    try:
        for operation in operations:
            fleet_cases = operation.as_strategy().map(naming_the_fleet)
            run_operation(
                operation, [(GenerationMode.POSITIVE, fleet_cases)], served, http, EXAMPLES_DOWN, CHECKS_DOWN
            )
    finally:
        served.stack.store.down = False
