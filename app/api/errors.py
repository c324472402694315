"""Every error the API returns has one shape: ``{"error": {"code", "message", "details"}}``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg_pool import PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from postbox import revision
from postbox.app.api.schemas import ErrorResponse
from postbox.app.services.errors import (
    ConfirmationRequiredError,
    ConflictError,
    InvalidInputError,
    InvalidLimitError,
    NotFoundError,
    ServiceError,
)
from postbox.encryption import EncryptionError
from postbox.errors import EnqueueError, PayloadTooLargeError, QueueFullError, SchemaOutdatedError, UnknownTaskError

log = logging.getLogger(__name__)
POOL_RETRY_AFTER = 1

HTTP_CODES = {
    400: "BAD_REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    406: "NOT_ACCEPTABLE",
    408: "REQUEST_TIMEOUT",
    409: "CONFLICT",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
    422: "VALIDATION_ERROR",
    429: "TOO_MANY_REQUESTS",
    503: "SERVICE_UNAVAILABLE",
}


class ApiError(Exception):
    """Raised by endpoints for a specific status and code."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = dict(details or {})
        self.headers = dict(headers or {})


def error_response(
    status: int,
    code: str,
    message: str,
    details: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"code": code, "message": message, "details": dict(details or {})}}
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


ANY_ROUTE = (408, 413, 503)  # the body guard's and the load shedding's answers, possible on every route


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries for the error statuses a route may return (and those of every route)."""
    return {
        status: {"model": ErrorResponse, "description": HTTP_CODES.get(status, "error")}
        for status in sorted({*statuses, *ANY_ROUTE})
    }


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or "body"


async def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [{"field": _field(e.get("loc", ())), "message": str(e.get("msg", "invalid"))} for e in exc.errors()]
    first = errors[0] if errors else {"field": "body", "message": "invalid request"}
    return error_response(
        422,
        "VALIDATION_ERROR",
        f"{first['field']}: {first['message']}",
        {"field": first["field"], "errors": errors},
    )


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = getattr(exc, "code", None) or HTTP_CODES.get(exc.status_code, "HTTP_ERROR")
    message = str(exc.detail) if exc.detail else code.lower()
    if exc.status_code == 404 and message == "Not Found":
        message = f"no route {request.method} {request.url.path}"
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code in (408, 413):  # the rest of the body is not read: the connection cannot be reused
        headers["Connection"] = "close"
    return error_response(exc.status_code, code, message, getattr(exc, "details", None), headers)


async def _api(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, exc.message, exc.details, exc.headers)


# The status of each service refusal (postbox.app.services.errors): the most specific class first.
SERVICE_STATUS: tuple[tuple[type[ServiceError], int], ...] = (
    (InvalidLimitError, 422),
    (InvalidInputError, 400),
    (NotFoundError, 404),
    (ConflictError, 409),
    (ConfirmationRequiredError, 400),
    (ServiceError, 400),
)


def service_status(exc: ServiceError) -> int:
    return next(status for cls, status in SERVICE_STATUS if isinstance(exc, cls))


async def _service(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    return error_response(service_status(exc), exc.code, str(exc), exc.details)


def enqueue_status(exc: EnqueueError) -> int:
    if isinstance(exc, QueueFullError):
        return 429
    if isinstance(exc, PayloadTooLargeError):
        return 413
    if isinstance(exc, UnknownTaskError):
        return 400
    return 422


async def _enqueue(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EnqueueError)
    details = dict(exc.details)
    if exc.field:
        details.setdefault("field", exc.field)
    headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, QueueFullError) else {}
    return error_response(enqueue_status(exc), exc.code, str(exc), details, headers)


async def _data(request: Request, exc: Exception) -> JSONResponse:
    # A value PostgreSQL refuses (out of range, NUL byte...): the caller's input, not our fault.
    log.info("refused input: %s", type(exc).__name__)
    return error_response(400, "INVALID_INPUT", "a value was refused by the database (out of range or malformed)")


async def _pool_timeout(request: Request, exc: Exception) -> JSONResponse:
    # No PostgreSQL connection free within POSTBOX_API_POOL_TIMEOUT: overloaded (or the database is away).
    log.warning("no database connection within the pool timeout on %s %s", request.method, request.url.path)
    return error_response(
        503,
        "OVERLOADED",
        "no database connection free in time; retry shortly",
        headers={"Retry-After": str(POOL_RETRY_AFTER)},
    )


async def _schema(request: Request, exc: Exception) -> JSONResponse:
    # No postbox schema, or one older than this code: not a bug of ours, and retrying will not help.
    outdated = exc if isinstance(exc, SchemaOutdatedError) else revision.missing_schema(exc)
    if outdated is None:
        return await _unexpected(request, exc)
    log.warning("%s %s: %s", request.method, request.url.path, outdated)
    return error_response(503, "SCHEMA_OUTDATED", str(outdated))


async def _encryption(request: Request, exc: Exception) -> JSONResponse:
    # An encrypted task's args cannot be sealed here: this API process has no key (or no cryptography package).
    log.warning("%s %s: %s", request.method, request.url.path, exc)
    return error_response(503, "ENCRYPTION_UNAVAILABLE", str(exc))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(500, "INTERNAL_ERROR", "internal error; see the server log")


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(ApiError, _api)
    app.add_exception_handler(ServiceError, _service)
    app.add_exception_handler(EnqueueError, _enqueue)
    app.add_exception_handler(psycopg.DataError, _data)
    app.add_exception_handler(PoolTimeout, _pool_timeout)
    app.add_exception_handler(SchemaOutdatedError, _schema)
    app.add_exception_handler(EncryptionError, _encryption)
    for missing in revision.MISSING_OBJECT:
        app.add_exception_handler(missing, _schema)
    app.add_exception_handler(Exception, _unexpected)
