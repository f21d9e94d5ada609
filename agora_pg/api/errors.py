"""The one place where errors become HTTP answers."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

from agora_pg.api.headers import EVERY_ANSWER, FRAMES_NONE
from agora_pg.api import params
from agora_pg.api.schemas import ErrorBody
from agora_pg.jobs import JobStatus, RunStatus
from agora_pg.runner.adhoc import RunInFlight
from agora_pg.runner.replay import ReplayFailed
from agora_pg.errors import (AgoraError, DatabaseUnavailable, InvalidArgument, InvalidTransition, JobConflict,
                             JobNotFound, ScheduleConflict, ScheduleNotFound, SchemaNotReady, TooManyStreams)

log = logging.getLogger("agora_pg.api")


class PayloadTooLarge(AgoraError):
    """A job payload is over ``AGORA_PG_API_MAX_PAYLOAD_BYTES``."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload: {size} bytes as JSON, more than the limit of {limit}")
        self.field = "payload"


class UnsupportedMediaType(AgoraError):
    """A request body that is not sent as JSON."""


class BadBody(AgoraError):
    """A request body that is empty or not a JSON text agora-pg can take."""


JSON_MEDIA_TYPES = ("application/json",)
MAX_PAYLOAD_DEPTH = 64  # levels of arrays and objects in a job's payload
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(rb"[\[\]{}]")
# A \uD800-\uDFFF escape: half of a UTF-16 pair; alone it is no character (JSON allows it,
# Unicode text and PostgreSQL do not).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


async def check_json_body(request: Request[Any, Any, Any]) -> None:
    """Before a handler that takes a JSON body: 415 for another content type, 400 for an
    empty body, one nested deeper than ``MAX_PAYLOAD_DEPTH`` below the body, one with a
    key twice in an object or one holding a lone surrogate, each saying what is wrong."""
    declared = request.headers.get("content-type")
    media = request.content_type[0].lower() if declared else "application/json"
    if media not in JSON_MEDIA_TYPES and not media.endswith("+json"):
        raise UnsupportedMediaType(
            f"Content-Type must be application/json, got {media!r} (with curl: -H 'Content-Type: application/json')"
        )
    body = await request.body()
    if not body.strip():
        raise BadBody('the request body is empty: send a JSON object, e.g. {"kind": "send_email"}')
    if nesting_depth(body, MAX_PAYLOAD_DEPTH + 1) > MAX_PAYLOAD_DEPTH + 1:
        raise InvalidArgument("payload", f"nested deeper than {MAX_PAYLOAD_DEPTH} levels of arrays and objects")
    document, duplicate = strict_json(body)
    if duplicate is not None:
        raise BadBody(f"the key {duplicate[:100]!r} appears twice in one object: send each key once")
    run_at = document.get("run_at") if isinstance(document, dict) else None
    if run_at is not None:  # (msgspec alone would read a number, or digits, as seconds since 1970)
        params.timestamp("run_at", run_at if isinstance(run_at, str) else json.dumps(run_at))
    if document is not None and _SURROGATE_ESCAPE.search(body):
        try:
            json.dumps(document, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise BadBody("the JSON body holds a lone surrogate escape (such as \\ud800): half of a UTF-16 "
                          "pair is not a character; send the whole pair or the character itself") from None


def nesting_depth(body: bytes, limit: int) -> int:
    """How deep arrays and objects nest in JSON text (counting stops past ``limit``)."""
    depth = deepest = 0
    for bracket in _JSON_BRACKET.finditer(_JSON_STRING.sub(b'""', body)):
        if bracket.group() in (b"[", b"{"):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        else:
            depth -= 1
    return deepest


class _DuplicateKey(Exception):
    pass


def strict_json(body: bytes) -> tuple[Any, str | None]:
    """(the document, the first key repeated within one of its objects or None); the
    document is None for text that is not JSON (its own parser says why)."""

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        seen: dict[str, object] = {}
        for key, value in items:
            if key in seen:
                raise _DuplicateKey(key)
            seen[key] = value
        return seen

    try:
        return json.loads(body, object_pairs_hook=pairs), None
    except _DuplicateKey as duplicate:
        return None, str(duplicate.args[0])
    except (ValueError, RecursionError):
        return None, None



_STATUSES: tuple[tuple[Any, int], ...] = (  # (error types, status), the first that matches
    (InvalidArgument | BadBody, 400), (UnsupportedMediaType, 415), (JobNotFound | ScheduleNotFound, 404),
    (InvalidTransition | ScheduleConflict | JobConflict | RunInFlight, 409), (PayloadTooLarge, 413),
    (DatabaseUnavailable | SchemaNotReady | TooManyStreams, 503), (ReplayFailed, 502),
)


def status_of(error: AgoraError) -> int:
    """The HTTP status an agora-pg error answers with (InvalidJob is an InvalidArgument)."""
    return next((status for kinds, status in _STATUSES if isinstance(error, kinds)), 500)


_NO_FILE = "no file or directory match the path"  # the start of a static files router's 404


def error_response(request: Request[Any, Any, Any], error: Exception) -> Response[ErrorBody]:
    """Map any exception a handler raised to a JSON ``ErrorBody``."""
    if isinstance(error, AgoraError):
        status = status_of(error)
        body = ErrorBody(status, public_detail(error), getattr(error, "field", None))
    elif isinstance(error, ValidationException):
        body = _validation_body(error, RunStatus if request.url.path.startswith("/runs") else JobStatus)
    elif isinstance(error, HTTPException) and error.status_code == 404 and error.detail.startswith(_NO_FILE):
        body = ErrorBody(404, "no such file")  # (Litestar's text names the install directory)
    elif isinstance(error, HTTPException):
        body = ErrorBody(error.status_code, _EXPLAINED.get(error.detail, error.detail))
    else:
        log.exception("unexpected error answering %s %s", request.method, request.url.path)
        body = ErrorBody(HTTP_500_INTERNAL_SERVER_ERROR, "internal error")
    # (an answer for a path no route matches is made outside the middleware: it gets the
    # security headers here)
    headers = {**{name.decode(): value.decode() for name, value in EVERY_ANSWER},
               "content-security-policy": FRAMES_NONE.decode(), **(getattr(error, "headers", None) or {})}
    return Response(body, status_code=body.status_code, headers=headers)


def public_detail(error: AgoraError) -> str:
    """What an answer may say of an error: the database's address and user stay in the
    log, not in an answer to a caller who may not be authenticated."""
    if isinstance(error, DatabaseUnavailable):
        log.warning("answering 503: %s", error)
        return "the database is unavailable (the API's log says why)"
    if isinstance(error, SchemaNotReady):
        log.warning("answering 503: %s", error)
        return "the agora schema is missing or not at the migrations' head: run agora-pg migrate"
    return str(error)


def _validation_body(error: ValidationException, statuses: type[JobStatus] | type[RunStatus]) -> ErrorBody:
    """Litestar's validation failures carry ``[{"key", "message", "source"}]``; name the first
    (a bad ``status`` with the ``statuses`` it may be)."""
    problems = error.extra if isinstance(error.extra, list) else []
    for problem in problems:
        if isinstance(problem, dict) and problem.get("message"):
            message = _EXPLAINED.get(str(problem["message"]), str(problem["message"]))
            if problem.get("key") == "status" and message.startswith("Invalid enum value"):
                message += f": expected one of {', '.join(status.value for status in statuses)}"
            key = problem.get("key") or None
            if key in (None, "data"):
                key = _body_field(message)
            return ErrorBody(400, f"{key}: {message}" if key else message, key)
    return ErrorBody(400, _EXPLAINED.get(error.detail, error.detail))


# msgspec's words for a body that is not JSON, said for a person.
_EXPLAINED = {
    "Input data was truncated": "the request body is not complete JSON (it ends early)",
    "Invalid UTF-8 encoded string": "the request body is not UTF-8 text",
}

# msgspec names the field of a body error in its message: "... - at `$.payload`",
# "Object contains unknown field `colour`", "Object missing required field `kind`".
_AT_PATH = re.compile(r"at `\$\.([A-Za-z_][A-Za-z_0-9]*)")
_FIELD = re.compile(r"(?:unknown|required) field `([^`]*)`")


def _body_field(message: str) -> str | None:
    match = _AT_PATH.search(message) or _FIELD.search(message)
    return match.group(1) if match else None
