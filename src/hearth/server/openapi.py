"""The OpenAPI 3.1 description of the HTTP API, written by hand from docs/http.md."""

from __future__ import annotations

from typing import Any

from hearth._version import __version__


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    words = {
        400: "bad JSON, wrong shape, bad id or an idempotency key over 256 characters",
        401: "missing or wrong bearer token",
        404: "unknown agent, conversation or submission",
        409: "idempotency key reused with another payload",
        413: "body over HEARTH_MAX_BODY",
        415: "Content-Type is not JSON",
        503: "shutting down, or the database is unreachable (Retry-After)",
    }
    return {str(s): _json(_ref("Error"), words[s]) for s in statuses}


_PATH_PARAMS = [
    {"name": "agent", "in": "path", "required": True, "schema": {"type": "string"}},
    {
        "name": "id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"},
    },
]

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {
                    "type": {"type": "string"},
                    "message": {"type": "string"},
                    "details": {},
                },
            }
        },
    },
    "Admission": {
        "type": "object",
        "description": 'Exactly one of "message" or "signal".',
        "properties": {
            "message": {"type": "string", "minLength": 1},
            "signal": {
                "type": "object",
                "required": ["type"],
                "properties": {
                    "type": {"type": "string", "minLength": 1},
                    "body": {"type": "string"},
                    "attributes": {"type": "object"},
                },
            },
            "idempotency_key": {"type": "string", "minLength": 1, "maxLength": 256},
        },
        "additionalProperties": False,
    },
    "Receipt": {
        "type": "object",
        "properties": {
            "submission_id": {"type": "string"},
            "conversation_id": {"type": "string"},
            "offset": {"type": "integer", "description": "last offset at admission; -1: none"},
            "stream_url": {"type": "string"},
            "deduplicated": {"type": "boolean"},
            "accepted_at": {"type": "number"},
        },
    },
    "Record": {
        "type": "object",
        "description": "A canonical stream record: envelope plus the fields of its type.",
        "required": ["offset", "id", "type"],
        "properties": {
            "offset": {"type": "integer"},
            "id": {"type": "string"},
            "type": {"type": "string"},
            "submission_id": {"type": ["string", "null"]},
            "attempt": {"type": ["integer", "null"]},
            "at": {"type": "string"},
        },
        "additionalProperties": True,
    },
    "Page": {
        "type": "object",
        "properties": {
            "records": {"type": "array", "items": _ref("Record"), "maxItems": 1000},
            "next_offset": {"type": "integer"},
            "up_to_date": {"type": "boolean"},
        },
    },
    "Submission": {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "status": {"enum": ["queued", "running", "waiting", "settled", "joined"]},
            "outcome": {"enum": ["completed", "failed", "aborted", None]},
            "error": {"type": ["object", "null"]},
            "reply": {"type": ["string", "null"]},
        },
    },
    "Snapshot": {
        "type": "object",
        "properties": {
            "conversation_id": {"type": "string"},
            "offset": {"type": "integer"},
            "messages": {"type": "array", "items": {"type": "object"}},
            "submissions": {"type": "array", "items": {"type": "object"}},
        },
    },
    "Wait": {
        "type": "object",
        "description": "A pending durable wait of a tool call (SPEC §15).",
        "properties": {
            "wait_id": {"type": "string"},
            "agent": {"type": "string"},
            "id": {"type": "string"},
            "conversation_id": {"type": "string"},
            "submission_id": {"type": "string"},
            "tool_call_id": {"type": "string"},
            "name": {"type": "string"},
            "prompt": {"description": "what the tool asks (any JSON, usually a string)"},
            "expires_at": {"type": ["string", "null"], "format": "date-time"},
            "state": {"enum": ["pending", "resolved", "timed_out", "aborted"]},
        },
    },
    "Waits": {
        "type": "object",
        "properties": {"waits": {"type": "array", "items": _ref("Wait")}},
    },
    "Resolve": {
        "type": "object",
        "required": ["value"],
        "properties": {"value": {"description": "any JSON value: step.wait returns it"}},
        "additionalProperties": False,
    },
    "Resolution": {
        "type": "object",
        "properties": {
            "wait_id": {"type": "string"},
            "submission_id": {"type": "string"},
            "resolved": {"const": True},
        },
    },
    "AbortResult": {
        "type": "object",
        "properties": {
            "aborted": {"type": "boolean"},
            "submission_ids": {"type": "array", "items": {"type": "string"}},
        },
    },
}


def openapi_document(root_path: str = "") -> dict[str, Any]:
    conv = "/agents/{agent}/{id}"
    offset_q = {"name": "offset", "in": "query", "schema": {"type": "integer", "default": -1}}
    wait_q = {"name": "wait", "in": "query", "schema": {"type": "number", "minimum": 0}}
    paths: dict[str, Any] = {
        conv: {
            "parameters": _PATH_PARAMS,
            "post": {
                "summary": "Admit a message or signal",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("Admission")}},
                },
                "responses": {
                    "202": _json(_ref("Receipt"), "admitted durably; Location: stream_url"),
                    **_errors(400, 401, 404, 409, 413, 415, 503),
                },
            },
            "get": {
                "summary": "Snapshot: messages and submissions",
                "responses": {"200": _json(_ref("Snapshot"), "snapshot"), **_errors(401, 404)},
            },
        },
        conv + "/stream": {
            "parameters": [
                *_PATH_PARAMS,
                offset_q,
                {"name": "Last-Event-ID", "in": "header", "schema": {"type": "integer"}},
                {"name": "limit", "in": "query", "schema": {"type": "integer", "maximum": 1000}},
                wait_q,
            ],
            "get": {
                "summary": "Records after offset: SSE with Accept: text/event-stream, else JSON",
                "responses": {
                    "200": {
                        "description": "SSE (id: offset, data: record JSON) or a JSON page",
                        "content": {
                            "text/event-stream": {"schema": {"type": "string"}},
                            "application/json": {"schema": _ref("Page")},
                        },
                    },
                    **_errors(400, 401, 404, 503),
                },
            },
        },
        conv + "/submissions/{sid}": {
            "parameters": [
                *_PATH_PARAMS,
                {"name": "sid", "in": "path", "required": True, "schema": {"type": "string"}},
                wait_q,
            ],
            "get": {
                "summary": "A submission's status; ?wait=S long-polls for its settlement",
                "responses": {
                    "200": _json(_ref("Submission"), "status"),
                    **_errors(400, 401, 404),
                },
            },
        },
        conv + "/abort": {
            "parameters": _PATH_PARAMS,
            "post": {
                "summary": "Abort every unsettled submission of the conversation",
                "responses": {
                    "200": _json(_ref("AbortResult"), "abort intents stamped"),
                    **_errors(401, 404),
                },
            },
        },
        conv + "/waits": {
            "parameters": _PATH_PARAMS,
            "get": {
                "summary": "The conversation's pending durable waits",
                "responses": {"200": _json(_ref("Waits"), "pending waits"), **_errors(401, 404)},
            },
        },
        conv + "/waits/{wait_id}": {
            "parameters": [
                *_PATH_PARAMS,
                {"name": "wait_id", "in": "path", "required": True, "schema": {"type": "string"}},
            ],
            "post": {
                "summary": "Resolve a durable wait with a JSON value (once; the same value again"
                " is 200)",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("Resolve")}},
                },
                "responses": {
                    "200": _json(_ref("Resolution"), "resolved; the submission runs again"),
                    "409": _json(
                        _ref("Error"),
                        "resolved with another value, timed out, aborted, or its submission"
                        " no longer waits",
                    ),
                    **_errors(400, 401, 404, 413, 415, 503),
                },
            },
        },
        "/waits": {
            "get": {
                "summary": "Every pending durable wait, oldest first",
                "responses": {"200": _json(_ref("Waits"), "pending waits"), **_errors(401)},
            }
        },
        "/healthz": {
            "get": {
                "summary": "Health: serving, and the database answers (no token needed)",
                "security": [],
                "responses": {
                    "200": {"description": "healthy"},
                    "503": _json(
                        _ref("Error"), "shutting down, or the database does not answer (why)"
                    ),
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus text format",
                "responses": {"200": {"description": "metrics"}},
            }
        },
        "/admin/submissions": {
            "get": {
                "summary": "Submissions by status, leases, stuck work",
                "responses": {"200": {"description": "admin view"}},
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "hearth", "version": __version__},
        "servers": [{"url": root_path or "/"}],
        "paths": paths,
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
