"""Property-based API fuzzing with Schemathesis against the app's own OpenAPI document.

Every documented operation gets a bounded, derandomized run (positive and negative data,
as admin and as alice, with path parameters either generated or filled with real seeded
ids/names) and every response is checked: never a 5xx, the body matches the documented
schema for its status, the status code and content type are documented.

The run is in-process (ASGI), against a freshly seeded cluster per operation
(tests/security/conftest.py), so a DELETE or drain never starves the other operations.
`follow=true` on the log endpoint is turned off: it streams until the attempt ends, and
the seeded attempt never ends.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.core.failures import FailureGroup

from tests.security.conftest import CANARY_TEXT, Cluster
from tests.security.routes import api_operations, build_app

# Examples per operation and generation mode; GPUSCHED_FUZZ_EXAMPLES raises it for a soak run.
EXAMPLES = int(os.environ.get("GPUSCHED_FUZZ_EXAMPLES", "25"))

CHECKS = {
    name: getattr(schemathesis.checks, name)
    for name in (
        "response_schema_conformance",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
    )
}


def _operations() -> list[tuple[str, str]]:
    """(METHOD, path) of every operation in the OpenAPI document."""
    doc = build_app().openapi()
    ops = [
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method in item
        if method in {"get", "put", "post", "delete", "patch"}
    ]
    return sorted(ops, key=lambda op: (op[1], op[0]))


OPERATIONS = _operations()


@dataclass(frozen=True)
class Finding:
    operation: str
    user: str
    check: str
    status: int
    detail: str

    def __str__(self) -> str:
        return f"{self.operation} as {self.user}: {self.check} (HTTP {self.status}) {self.detail}"


def _real_path_parameters(cluster: Cluster, path: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if "{job_id}" in path:
        values["job_id"] = cluster.ml_running_job if "logs" in path else cluster.ml_job
    if "{name}" in path:
        if path.startswith("/api/v1/nodes"):
            values["name"] = cluster.node
        elif path.startswith("/api/v1/windows"):
            values["name"] = cluster.window
        elif path.startswith("/api/v1/batches"):
            values["name"] = cluster.batch
    return values


@functools.cache
def _loaded_schema() -> Any:
    """Loaded once per process, not per operation: loading (parsing the document and
    resolving its references) was half of each operation's time, and every app these tests
    build serves the same document."""
    return schemathesis.openapi.from_asgi("/openapi.json", build_app())


def fuzz(cluster: Cluster, method: str, path: str) -> list[Finding]:
    schema = _loaded_schema()
    schema.app = cluster.api.client.app  # calls go to this test's freshly seeded app
    operation = schema[path][method]
    label = f"{method} {path}"
    real = _real_path_parameters(cluster, path)
    findings: list[Finding] = []

    def record(user: str, check: str, status: int, detail: str) -> None:
        # One finding per kind (a known bug must not hide an unknown one of the same status).
        finding = Finding(label, user, check, status, detail.strip().splitlines()[0][:300])
        key = (user, check, status, finding.detail[:60])
        if len(findings) < 50 and all(
            (f.user, f.check, f.status, f.detail[:60]) != key for f in findings
        ):
            findings.append(finding)

    strategy = st.one_of(
        operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
        operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )

    @hsettings(
        max_examples=EXAMPLES * 2,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy, user=st.sampled_from(["admin", "alice"]), use_real=st.booleans())
    def run(case: schemathesis.Case, user: str, use_real: bool) -> None:
        if use_real and real and case.path_parameters is not None:
            case.path_parameters = {**case.path_parameters, **real}
        if case.query and case.query.get("follow") not in (None, False, "false"):
            # follow=true streams until the attempt ends; the seeded attempt never does.
            case.query = {**case.query, "follow": False}
        headers = dict(cluster.api.as_(user))
        try:
            response = case.call(headers=headers)
        except Exception as exc:  # the app raised: a 500 in production
            record(user, "server error (exception)", 500, f"{type(exc).__name__}: {exc}")
            return
        if response.status_code >= 500:
            record(user, "not_a_server_error", response.status_code, response.text)
            return
        if CANARY_TEXT in response.text:
            record(user, "canary file served", response.status_code, response.text)
        for name, check in CHECKS.items():
            try:
                case.validate_response(response, checks=[check], headers=headers)
            except FailureGroup as group:
                for failure in group.exceptions:
                    message = failure.message.replace("\n", " ")
                    body = response.text[:120]
                    record(user, name, response.status_code, f"{failure.title}: {message} {body}")

    run()
    return findings


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_fuzzed_operation_conforms_and_never_5xx(cluster: Cluster, method: str, path: str) -> None:
    findings = list(fuzz(cluster, method, path))
    assert not findings, "\n".join(map(str, findings))


def test_every_operation_is_fuzzed() -> None:
    """The OpenAPI document lists every /api/v1 route (none hidden from the fuzzer)."""
    served = {(op.method, op.path) for op in api_operations(build_app())}
    assert served <= set(OPERATIONS)


def test_error_statuses_are_documented() -> None:
    app = build_app()
    doc = app.openapi()
    missing = []
    for op in api_operations(app):
        documented = set(doc["paths"][op.path][op.method.lower()]["responses"])
        expected = {"401", "429"} if op.needs_token else set()
        if op.admin_only:
            expected.add("403")
        if op.params:
            expected.add("404")
        if expected - documented:
            missing.append(f"{op.id}: {sorted(expected - documented)}")
    assert missing == []
