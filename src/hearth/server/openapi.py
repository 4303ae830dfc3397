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
        403: "a request made with the console's cookie from another origin",
        404: "unknown agent, conversation or submission",
        409: "idempotency key reused with another payload",
        413: "body over HEARTH_MAX_BODY",
        415: "Content-Type is not JSON",
        503: "shutting down, or the database is unreachable (Retry-After)",
    }
    return {str(s): _json(_ref("Error"), words[s]) for s in statuses}


def _html(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"text/html": {"schema": {"type": "string"}}}}


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
            "status": {"enum": ["queued", "running", "settled", "joined"]},
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
    "ConversationList": {
        "type": "object",
        "required": ["conversations", "next"],
        "properties": {
            "conversations": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["agent", "id", "conversation_id", "last_activity", "unsettled"],
                    "properties": {
                        "agent": {"type": "string"},
                        "id": {"type": "string"},
                        "conversation_id": {"type": "string"},
                        "last_activity": {"type": "number", "description": "unix seconds"},
                        "last_offset": {"type": "integer"},
                        "unsettled": {"type": "integer", "minimum": 0},
                        "parent": {"type": ["object", "null"]},
                    },
                },
            },
            "next": {
                "type": ["string", "null"],
                "description": "pass as ?after= for the next (older) page; null on the last",
            },
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
        "/conversations": {
            "get": {
                "summary": "Conversations, newest activity first, filtered and paged",
                "parameters": [
                    {"name": "agent", "in": "query", "schema": {"type": "string"}},
                    {"name": "status", "in": "query", "schema": {"enum": ["active", "idle"]}},
                    {"name": "after", "in": "query", "schema": {"type": "string"}},
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
                    },
                ],
                "responses": {
                    "200": _json(_ref("ConversationList"), "one page"),
                    **_errors(400, 401),
                },
            }
        },
        "/": {
            "get": {
                "summary": "The web console: the conversation list (HTML)",
                "responses": {"200": _html("the page"), "401": _html("the sign-in form")},
            }
        },
        "/console/{agent}/{id}": {
            "parameters": _PATH_PARAMS,
            "get": {
                "summary": "The web console: one conversation (HTML)",
                "responses": {
                    "200": _html("the page"),
                    "401": _html("the sign-in form"),
                    "404": _html("the page of a conversation with no records yet"),
                },
            },
        },
        "/console/session": {
            "post": {
                "summary": "Sign in to the console: the token in a form body sets a session cookie",
                "security": [],
                "requestBody": {
                    "content": {
                        "application/x-www-form-urlencoded": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "token": {"type": "string"},
                                    "next": {"type": "string"},
                                },
                            }
                        }
                    }
                },
                "responses": {
                    "303": {"description": "signed in: Set-Cookie, then the page asked for"},
                    "401": _html("wrong token: the sign-in form again"),
                    **_errors(403, 413),
                },
            }
        },
        "/console/logout": {
            "post": {
                "summary": "Sign out of the console: clears the session cookie",
                "security": [],
                "responses": {"303": {"description": "signed out"}, **_errors(403)},
            }
        },
        "/admin/submissions": {
            "get": {
                "summary": "Submissions by status, leases, stuck work",
                "responses": {"200": {"description": "admin view"}},
            }
        },
    }
    paths.update(_input_paths())
    return {
        "openapi": "3.1.0",
        "info": {"title": "hearth", "version": __version__},
        "servers": [{"url": root_path or "/"}],
        "paths": paths,
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "session": {"type": "apiKey", "in": "cookie", "name": "hearth_session"},
            },
        },
        "security": [{"bearer": []}, {"session": []}],
    }


def _input_paths() -> dict[str, Any]:
    """Channels and schedules (docs/channels.md)."""
    name = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
    receipt = {
        "type": "object",
        "properties": {
            "delivery_id": {"type": "string"},
            "submission_ids": {"type": "array", "items": {"type": "string"}},
            "deduplicated": {"type": "boolean"},
        },
    }
    failed = _json(_ref("Error"), "verify or receive failed (channel_failed): nothing admitted")
    return {
        "/channels/{name}": {
            "parameters": [name],
            "post": {
                "summary": "A webhook delivery, authenticated by the channel's verify",
                "security": [],
                "requestBody": {"required": True, "content": {"*/*": {"schema": {}}}},
                "responses": {
                    "202": _json(receipt, "every dispatch admitted, once per delivery id"),
                    "401": _json(_ref("Error"), "missing or wrong signature"),
                    "500": failed,
                    **_errors(400, 404, 413, 503),
                },
            },
        },
        "/channels/{name}/deliveries": {
            "parameters": [
                name,
                {"name": "status", "in": "query", "schema": {"enum": ["admitted", "failed"]}},
                {"name": "limit", "in": "query", "schema": {"type": "integer", "maximum": 1000}},
                {"name": "full", "in": "query", "schema": {"type": "boolean"}},
            ],
            "get": {
                "summary": "The channel's kept deliveries, newest first",
                "responses": {"200": {"description": "deliveries"}, **_errors(400, 401, 404)},
            },
        },
        "/channels/{name}/deliveries/{delivery_id}/replay": {
            "parameters": [
                name,
                {
                    "name": "delivery_id",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string"},
                },
            ],
            "post": {
                "summary": "Route a failed delivery again (an admitted one is only answered)",
                "responses": {
                    "202": _json(receipt, "admitted"),
                    "500": failed,
                    **_errors(401, 404, 503),
                },
            },
        },
        "/schedules": {
            "get": {
                "summary": "Each schedule with its last and next occurrence (UTC ISO)",
                "responses": {"200": {"description": "schedules"}, **_errors(401)},
            }
        },
    }
