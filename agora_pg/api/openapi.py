"""The OpenAPI document, told the truth: what Litestar generates from the handlers,
corrected where the API does more than the types say (pure: a dict in, changed in place).

Litestar's generator drops constraints whose value is falsy (``minimum: 0``), does not
say that a body refuses unknown fields, and knows only the success status of each
route. Here: the job body's schema comes from msgspec (exact), each operation lists
every status it can answer with the shared error body, the bearer token is a security
scheme when one is set, and the checks agora-pg makes beyond the types (plain ids and
cursors, times between 1970 and 9000, text without NUL characters or surrounding
spaces) are patterns a client or a fuzzer can read.
"""

from __future__ import annotations

from typing import Any

import msgspec

from agora_pg.api.schemas import ErrorBody, JobCreate

ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}
# An RFC 3339 time whose year is 1970-8999 (agora-pg refuses others: the database
# would store year 1 as -infinity, year 9999 as +infinity).
TIME_PATTERN = r"^(19[7-9][0-9]|[2-8][0-9]{3})-"
CURSOR_PATTERN = r"^[1-9][0-9]{0,17}$"
EVENT_ID_PATTERN = r"^[0-9]{1,17}$"  # (agora_pg.events.model.MAX_CURSOR_DIGITS)
# Text PostgreSQL can hold: no NUL (nor a lone half of a UTF-16 pair, which no pattern
# here says: validators such as jsonschema-rs refuse surrogates in a pattern). kind,
# queue: no surrounding whitespace; name, dedup_key, filters: not blank.
_CHARACTER = r"[^\x00]"
_VISIBLE = r"[^\s\x00\x1c-\x1f\x85]"  # (Python strips \x1c-\x1f and \x85 too)
# kind, queue: no control or bidi character either (agora_pg.printable: they are shown in
# terminals, log lines and metric labels)
_CONTROLS = r"\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_IDENTIFIER_CHARACTER = rf"[^{_CONTROLS}]"
_IDENTIFIER_VISIBLE = rf"[^\s{_CONTROLS}]"
TEXT_PATTERN = rf"^{_CHARACTER}*$"
IDENTIFIER_PATTERN = rf"^{_IDENTIFIER_VISIBLE}({_IDENTIFIER_CHARACTER}*{_IDENTIFIER_VISIBLE})?$"
LABEL_PATTERN = rf"^{_CHARACTER}*{_VISIBLE}{_CHARACTER}*$"
PUBLIC_PATHS = ("/health", "/ready")

_WHY = {
    "400": "the input is malformed: `field` names it",
    "401": "the bearer token is missing or wrong",
    "403": "the API has no token: it answers only this machine's clients, for its own Host and Origin",
    "404": "no such job or schedule (or no pipeline of AGORA_PG_PIPELINES_CONFIG to replay)",
    "409": "the transition is not allowed in the current state",
    "413": "the payload is larger than AGORA_PG_API_MAX_PAYLOAD_BYTES",
    "415": "the body is not sent as application/json",
    "502": "the replay failed in a step or a sink: its run is recorded, the dead letters wait",
    "503": "the database is unavailable or not migrated",
}


def correct(document: dict[str, Any], *, token: bool, payload_types: dict[str, type] | None = None) -> None:
    """Correct Litestar's ``document`` for an API with (``token``) or without a token;
    ``payload_types``: the declared payload type of each typed kind."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas["ErrorBody"] = _struct_schema(ErrorBody)
    schemas["JobCreate"] = _job_create_schema()
    if payload_types:
        _describe_typed_payloads(schemas, payload_types)
    schemas["JsonValue"] = _json_value_schema()
    if token:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, item in document.get("paths", {}).items():
        for method, operation in item.items():
            if isinstance(operation, dict) and "responses" in operation:
                _correct_operation(path, method, operation, token)
    _link(document, ("/jobs", "post", "201"), "$response.body#/id", "job_id",
          ["JobsJobIdGetJob", "JobsJobIdRetryRetryJob", "JobsJobIdCancelCancelJob"])
    _link(document, ("/schedules", "get", "200"), "$response.body#/0/pipeline_id", "pipeline_id",
          ["SchedulesPipelineIdGetSchedule", "SchedulesPipelineIdPausePause", "SchedulesPipelineIdResumeResume",
           "SchedulesPipelineIdTriggerTrigger"])


def _link(document: dict[str, Any], response: tuple[str, str, str], value: str, parameter: str,
          operation_ids: list[str]) -> None:
    """OpenAPI links: the operations that take ``parameter`` from this response's ``value``
    (what a client, or a stateful fuzzer, calls next)."""
    path, method, status = response
    answer = document.get("paths", {}).get(path, {}).get(method, {}).get("responses", {}).get(status)
    if answer is not None:
        answer["links"] = {operation_id: {"operationId": operation_id, "parameters": {parameter: value}}
                           for operation_id in operation_ids}


def _correct_operation(path: str, method: str, operation: dict[str, Any], token: bool) -> None:
    responses = operation["responses"]
    codes = {"503"} if path != "/health" else set()
    if operation.get("parameters") or method == "post" and path == "/jobs":
        codes.add("400")
    if token and path not in PUBLIC_PATHS:
        codes.add("401")
        operation["security"] = [{"bearer": []}]
    if not token:
        codes.add("403")
    if "{" in path:
        codes.add("404")
    if method == "post" and path != "/jobs":
        codes.add("409")
    if path.endswith("/replay"):
        codes.add("502")
    if method == "post" and path == "/jobs":
        codes |= {"413", "415"}
        responses["200"] = {"description": "a live job already holds this dedup_key: that job, unchanged",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/JobOut"}}}}
    for code in sorted(codes):
        responses[code] = {"description": _WHY[code], "content": {"application/json": {"schema": ERROR_REF}}}
    for parameter in operation.get("parameters", []):
        _correct_parameter(parameter)
    if path == "/events":
        _describe_event_stream(operation)


def _describe_event_stream(operation: dict[str, Any]) -> None:
    """``/events`` answers ``text/event-stream``, and its cursor is an event id (the digits
    of the stream's ``id:`` lines), not a time."""
    cursor = {"type": "string", "pattern": EVENT_ID_PATTERN,
              "description": "an event id, as the stream's `id:` lines give (microseconds since 1970, "
                             "at most 7 days back)"}
    for parameter in operation.get("parameters", []):
        if parameter.get("name") == "since":
            parameter["schema"] = dict(cursor)
            parameter["description"] = "replay the changes after this event id first"
    operation["parameters"] = [*operation.get("parameters", []), {
        "name": "Last-Event-ID", "in": "header", "required": False, "schema": dict(cursor),
        "description": "what a reconnecting EventSource sends: as `since`, and over it",
    }]
    operation["responses"]["200"] = {
        "description": "Server-Sent Events: `event:` the event's type (job.enqueued, job.started, job.progress, "
                       "job.finished, job.cancelled, ping), `data:` its JSON, `id:` its event id",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }


def _correct_parameter(parameter: dict[str, Any]) -> None:
    name, where = parameter.get("name"), parameter.get("in")
    if name == "job_id":
        parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}
    elif where == "query" and name == "cursor":
        parameter["schema"] = {"type": "string", "pattern": CURSOR_PATTERN}
    elif where == "query" and name in ("since", "until"):
        parameter["schema"] = {"type": "string", "format": "date-time", "pattern": TIME_PATTERN}
    elif where == "query" and name in ("kind", "queue", "pipeline_id", "search") or name == "pipeline_id":
        parameter["schema"] = {"type": "string", "minLength": 1, "maxLength": 1000, "pattern": LABEL_PATTERN}


def _struct_schema(struct: type) -> dict[str, Any]:
    generated = msgspec.json.schema(struct)
    name = generated["$ref"].rsplit("/", 1)[1]
    schema: dict[str, Any] = generated["$defs"][name]
    return schema


def _job_create_schema() -> dict[str, Any]:
    schema = _struct_schema(JobCreate)
    schema["additionalProperties"] = False  # (msgspec's forbid_unknown_fields)
    properties = schema["properties"]
    properties["kind"]["pattern"] = IDENTIFIER_PATTERN
    properties["queue"] = {"anyOf": [{"type": "string", "minLength": 1, "maxLength": 100, "pattern": IDENTIFIER_PATTERN},
                                     {"type": "null"}], "default": None,
                           "description": "the kind's queue when the API knows the kinds, else default"}
    for field in ("name", "dedup_key"):
        properties[field] = {"anyOf": [{"type": "string", "minLength": 1, "maxLength": 1000, "pattern": LABEL_PATTERN},
                                       {"type": "null"}], "default": None}
    properties["run_at"] = {"anyOf": [{"type": "string", "format": "date-time", "pattern": TIME_PATTERN},
                                      {"type": "null"}], "default": None}
    properties["payload"] = {**_json_object(), "default": {},
                             "description": "a JSON object, nested at most 64 levels, with no NUL characters"}
    return schema


def _describe_typed_payloads(schemas: dict[str, Any], payload_types: dict[str, type]) -> None:
    """JobCreate's payload, for each typed kind, is its payload type's schema (JSON Schema's
    ``if``/``then``, which OpenAPI 3.1 carries)."""
    kinds = sorted(payload_types)
    refs, components = msgspec.json.schema_components([payload_types[kind] for kind in kinds],
                                                      ref_template="#/components/schemas/{name}")
    schemas.update(components)
    schemas["JobCreate"]["allOf"] = [
        {"if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
         "then": {"properties": {"payload": ref}}}
        for kind, ref in zip(kinds, refs, strict=True)
    ]
    listed = ", ".join(f"{kind} ({payload_types[kind].__name__})" for kind in kinds)
    schemas["JobCreate"]["description"] = (schemas["JobCreate"].get("description", "")
                                           + f"\n\nKinds with a declared payload type: {listed}.")


def _json_object() -> dict[str, Any]:
    return {"type": "object", "propertyNames": {"pattern": TEXT_PATTERN},
            "additionalProperties": {"$ref": "#/components/schemas/JsonValue"}}


def _json_value_schema() -> dict[str, Any]:
    """Any JSON value jsonb can hold (no NUL, no lone surrogate in text). Typeless: each keyword applies to its own
    type's values, and openapi-python-client reads "any value" (a recursive anyOf, it cannot: test_generated_client)."""
    ref = {"$ref": "#/components/schemas/JsonValue"}
    return {"description": "any JSON value without NUL characters", "pattern": TEXT_PATTERN, "items": ref,
            "propertyNames": {"pattern": TEXT_PATTERN}, "additionalProperties": ref}
