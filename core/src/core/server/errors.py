"""Errors in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}`` and their handlers."""

from __future__ import annotations

import logging
import re
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    503: "server_overloaded",
}


class APIError(Exception):
    """An error to answer with ``status`` and OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        """The JSON body: ``{"error": {...}}``."""
        kind = _TYPES.get(self.status, "internal_server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """The body of every error answer (OpenAI's shape)."""

    error: ErrorDetail


_STATUS_TEXT = {
    400: "Bad request: a field is wrong or the request can never be served (error.param names the field)",
    401: "Missing or wrong API key",
    404: "No such model on this server",
    413: "Request body larger than the server's limit (--max-request-bytes)",
    503: "Busy now (queue full: retry later) or the engine is not running",
}


def error_responses(statuses: tuple[int, ...] = (400, 404, 413, 503), with_key: bool = False) -> dict:
    """A route's ``responses=`` for the OpenAPI schema: the error statuses it answers, with :class:`ErrorResponse`."""
    return {s: {"model": ErrorResponse, "description": _STATUS_TEXT[s]} for s in (*statuses, *((401,) * with_key))}


def document_error_statuses(app: FastAPI) -> None:
    """Have ``app``'s OpenAPI schema say what the server answers: FastAPI documents 422 for a
    body that fails validation, and this server answers those with 400."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = generate()
            for path_item in schema.get("paths", {}).values():
                for operation in path_item.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


_TYPE_MISMATCHES = frozenset(
    {
        "string_type",
        "int_type",
        "float_type",
        "bool_type",
        "list_type",
        "dict_type",
        "model_type",
        "model_attributes_type",
    }
)
_SCALARS = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "none": "null"}


def _is_branch(part: object) -> bool:
    """Whether a pydantic error location part names a union branch (``str``, ``list[str]``) rather than a field."""
    return isinstance(part, str) and (part in _SCALARS or "[" in part or "-" in part or part[:1].isupper())


def _describe(branch: str, plural: bool = False) -> str:
    """``list[constrained-int]`` -> ``a list of integers``."""
    if branch.startswith("list[") and branch.endswith("]"):
        return ("lists of " if plural else "a list of ") + _describe(branch[5:-1], plural=True)
    name = branch.rsplit("-", 1)[-1]
    if name in _SCALARS:
        noun = _SCALARS[name]
        return f"{noun}s" if plural else ("an " if noun[0] in "aeiou" else "a ") + noun
    if name.startswith("dict["):
        return "objects" if plural else "an object"
    words = re.sub(r"(?<!^)(?=[A-Z])", " ", name).lower()  # ContentPart -> content part
    return f"{words}s" if plural else f"a {words}"


def _message(error: dict) -> str:
    return str(error.get("msg", "")).removeprefix("Value error, ")


def _field(loc: list[object]) -> str:
    return ".".join(str(p) for p in loc) or "the request body"


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One line naming the first wrong field and what it accepts (a union's alternatives in words)."""
    errors = exc.errors()
    if not errors:
        return "invalid request body", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {first.get('msg')}", None
    loc = [p for p in first.get("loc", ()) if p != "body"]
    cut = next((i for i, p in enumerate(loc) if _is_branch(p)), None)
    if cut is None:
        param = _field(loc)
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        return f"field {param!r}: {_message(first)}{more}", param
    prefix = loc[:cut]
    branches: list[str] = []
    detail = ""
    for error in errors:
        where = [p for p in error.get("loc", ()) if p != "body"]
        if where[:cut] != prefix or len(where) <= cut:
            continue
        if where[cut] not in branches:
            branches.append(where[cut])
        deeper = [p for p in where[cut + 1 :] if not _is_branch(p)]
        if deeper and error.get("type") not in _TYPE_MISMATCHES and not detail:
            detail = f" ({_field(prefix + deeper)!r}: {_message(error)})"
    param = _field(prefix)
    choices = [_describe(b) for b in branches]
    accepted = choices[0] if len(choices) == 1 else ", ".join(choices[:-1]) + " or " + choices[-1]
    return f"field {param!r} must be {accepted}{detail}", param


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error, expected or not, in OpenAI's shape; the server stays up."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return APIError(400, message, param).response()

    @app.exception_handler(ValueError)
    async def _value_error(_: Request, exc: ValueError) -> JSONResponse:
        return APIError(400, str(exc)).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        try:
            phrase = HTTPStatus(exc.status_code).phrase
        except ValueError:
            phrase = "error"
        message = exc.detail if isinstance(exc.detail, str) and exc.detail else phrase
        return APIError(exc.status_code, message).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error serving %s %s", request.method, request.url.path)
        return APIError(500, f"internal server error: {type(exc).__name__}: {exc}").response()
