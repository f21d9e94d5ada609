"""The one place where errors become HTTP answers."""

from __future__ import annotations

import logging
import re
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

from agora_pg.api.schemas import ErrorBody
from agora_pg.errors import (
    AgoraError,
    DatabaseUnavailable,
    InvalidArgument,
    InvalidJob,
    InvalidTransition,
    JobConflict,
    JobNotFound,
    ScheduleConflict,
    ScheduleNotFound,
    SchemaNotReady,
)

log = logging.getLogger("agora_pg.api")


class PayloadTooLarge(AgoraError):
    """A job payload is over ``AGORA_PG_API_MAX_PAYLOAD_BYTES``."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload: {size} bytes as JSON, more than the limit of {limit}")
        self.field = "payload"


def status_of(error: AgoraError) -> int:
    """The HTTP status an agora-pg error answers with."""
    if isinstance(error, InvalidJob | InvalidArgument):
        return 400
    if isinstance(error, JobNotFound | ScheduleNotFound):
        return 404
    if isinstance(error, InvalidTransition | ScheduleConflict | JobConflict):
        return 409
    if isinstance(error, PayloadTooLarge):
        return 413
    if isinstance(error, DatabaseUnavailable | SchemaNotReady):
        return 503
    return 500


def error_response(request: Request[Any, Any, Any], error: Exception) -> Response[ErrorBody]:
    """Map any exception a handler raised to a JSON ``ErrorBody``."""
    if isinstance(error, AgoraError):
        status = status_of(error)
        body = ErrorBody(status, str(error), getattr(error, "field", None))
    elif isinstance(error, ValidationException):
        body = _validation_body(error)
    elif isinstance(error, HTTPException):
        body = ErrorBody(error.status_code, error.detail)
    else:
        log.exception("unexpected error answering %s %s", request.method, request.url.path)
        body = ErrorBody(HTTP_500_INTERNAL_SERVER_ERROR, "internal error")
    headers = getattr(error, "headers", None) or None
    return Response(body, status_code=body.status_code, headers=headers)


def _validation_body(error: ValidationException) -> ErrorBody:
    """Litestar's validation failures carry ``[{"key", "message", "source"}]``; name the first."""
    problems = error.extra if isinstance(error.extra, list) else []
    for problem in problems:
        if isinstance(problem, dict) and problem.get("message"):
            message = str(problem["message"])
            key = problem.get("key") or None
            if key in (None, "data"):
                key = _body_field(message)
            return ErrorBody(400, f"{key}: {message}" if key else message, key)
    return ErrorBody(400, error.detail)


# msgspec names the field of a body error in its message: "... - at `$.payload`",
# "Object contains unknown field `colour`", "Object missing required field `kind`".
_AT_PATH = re.compile(r"at `\$\.([A-Za-z_][A-Za-z_0-9]*)")
_FIELD = re.compile(r"(?:unknown|required) field `([^`]*)`")


def _body_field(message: str) -> str | None:
    match = _AT_PATH.search(message) or _FIELD.search(message)
    return match.group(1) if match else None
