"""The OpenAPI 3.1 description of the HTTP API, written by hand from docs/http.md.

It is exact enough to test the server against (the test suite runs schemathesis on it): every
route, every status it can answer, every body. It depends on the server it describes: ``agent``
is an enum of the app's agents, and bearer security is declared only when a token is set. The
SSE form of ``/stream`` (``Accept: text/event-stream``) stays open for good, so it is described
in words only; the JSON form is the one described.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hearth._version import __version__
from hearth.attachments import MAX_ATTACHMENTS
from hearth.ids import ID_RE, MAX_IDEMPOTENCY_KEY
from hearth.server.attachments import BASE64_PATTERN, MEDIA_TYPE_PATTERN
from hearth.server.tail import MAX_OFFSET, MAX_WAIT_S, PAGE_LIMIT
from hearth.server.views import CURSOR_RE

# A JSON Schema pattern is an ECMA-262 regex, where ``$`` matches only at the very end.
ID_PATTERN = ID_RE.pattern
SID_PATTERN = "^s_[0-9a-f]{20}$"
SHA256_PATTERN = "^[0-9a-f]{64}$"  # as stored and shown
SHA256_ASKED = "^[0-9a-fA-F]{64}$"  # as a path may name it (either case)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERROR_WORDS = {
    400: "bad JSON, wrong shape, bad id, a parameter out of range",
    401: "missing or wrong bearer token (WWW-Authenticate: Bearer)",
    403: "a request from a web page of another origin (its Origin header names another"
    " server), or one made with the console's cookie and no Origin naming this server",
    404: "unknown agent, conversation or submission",
    408: "the body did not arrive in time",
    409: "idempotency key reused with another payload, or input or an abort sent to a delegated"
    " task's conversation",
    413: "body over HEARTH_MAX_BODY (HEARTH_MAX_UPLOAD with attachments), or a file over"
    " HEARTH_MAX_ATTACHMENT (named in the message)",
    415: "Content-Type is not JSON (nor multipart/form-data where files are taken)",
    503: "shutting down, too many open streams, or the database is unreachable (Retry-After)",
}


def _answers(ok: dict[str, dict[str, Any]], *errors: int, token: bool) -> dict[str, Any]:
    out = dict(ok)
    statuses = sorted({*errors, 503, *((401,) if token else ())})
    for status in statuses:
        out[str(status)] = _json(_ref("Error"), _ERROR_WORDS[status])
    return out


_ANY_JSON: dict[str, Any] = {}  # any JSON value

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "additionalProperties": False,
        "properties": {
            "error": {
                "type": "object",
                "required": ["type", "message", "details"],
                "additionalProperties": False,
                "properties": {
                    "type": {"type": "string"},
                    "message": {"type": "string"},
                    "details": _ANY_JSON,
                },
            }
        },
    },
    "IdempotencyKey": {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_IDEMPOTENCY_KEY,
        # No NUL, and not of the form of hearth's own (a schedule's or a channel's).
        "pattern": "^(?!schedule:|channel:)[^\\u0000]*$",
    },
    "MessageAdmission": {
        "type": "object",
        "required": ["message"],
        "additionalProperties": False,
        "properties": {
            "message": {"type": "string", "minLength": 1},
            "idempotency_key": _ref("IdempotencyKey"),
            "attachments": {
                "type": "array",
                "items": _ref("AttachmentEntry"),
                "maxItems": MAX_ATTACHMENTS,
            },
        },
    },
    "FileAdmission": {
        "type": "object",
        "description": "A message whose text may be empty: it carries files.",
        "required": ["attachments"],
        "additionalProperties": False,
        "properties": {
            "message": {"type": "string"},
            "idempotency_key": _ref("IdempotencyKey"),
            "attachments": {
                "type": "array",
                "items": _ref("AttachmentEntry"),
                "minItems": 1,
                "maxItems": MAX_ATTACHMENTS,
            },
        },
    },
    "AttachmentEntry": {
        "type": "object",
        "description": (
            "A file: its bytes in base64 (at most HEARTH_MAX_ATTACHMENT bytes once decoded),"
            " a name (a label; sanitised) and a media type (sniffed when left out)."
        ),
        "required": ["data"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string"},
            "media_type": {"type": "string", "pattern": MEDIA_TYPE_PATTERN},
            "data": {"type": "string", "pattern": BASE64_PATTERN},
        },
    },
    "AttachmentPart": {
        "type": "object",
        "description": "How a user_message's content references a stored file.",
        "required": ["type", "sha256", "name", "media_type", "size"],
        "properties": {
            "type": {"const": "attachment"},
            "sha256": {"type": "string", "pattern": SHA256_PATTERN},
            "name": {"type": "string"},
            "media_type": {"type": "string"},
            "size": {"type": "integer", "minimum": 1},
        },
    },
    "Collected": {
        "type": "object",
        "required": ["dry_run", "deleted", "count", "bytes"],
        "properties": {
            "dry_run": {"type": "boolean"},
            "deleted": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["sha256", "media_type", "size"],
                    "properties": {
                        "sha256": {"type": "string", "pattern": SHA256_PATTERN},
                        "media_type": {"type": "string"},
                        "size": {"type": "integer"},
                    },
                },
            },
            "count": {"type": "integer", "minimum": 0},
            "bytes": {"type": "integer", "minimum": 0},
        },
    },
    "SignalAdmission": {
        "type": "object",
        "required": ["signal"],
        "additionalProperties": False,
        "properties": {
            "signal": {
                "type": "object",
                "required": ["type"],
                "additionalProperties": False,
                "properties": {
                    "type": {"type": "string", "minLength": 1},
                    "body": {"type": "string"},
                    "attributes": {"type": ["object", "null"]},
                },
            },
            "idempotency_key": _ref("IdempotencyKey"),
        },
    },
    "Admission": {
        "anyOf": [_ref("MessageAdmission"), _ref("FileAdmission"), _ref("SignalAdmission")]
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
    "Receipt": {
        "type": "object",
        "required": [
            "submission_id",
            "conversation_id",
            "offset",
            "stream_url",
            "deduplicated",
            "accepted_at",
        ],
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
        },
        "additionalProperties": True,
    },
    "Page": {
        "type": "object",
        "required": ["records", "next_offset", "up_to_date"],
        "properties": {
            "records": {"type": "array", "items": _ref("Record"), "maxItems": PAGE_LIMIT},
            "next_offset": {"type": "integer"},
            "up_to_date": {"type": "boolean"},
        },
    },
    "Status": {"enum": ["queued", "running", "waiting", "settled", "joined"]},
    "Outcome": {"enum": ["completed", "failed", "aborted", None]},
    "Submission": {
        "type": "object",
        "required": ["id", "conversation_id", "status", "outcome", "error", "reply", "attempt"],
        "properties": {
            "id": {"type": "string"},
            "conversation_id": {"type": "string"},
            "status": _ref("Status"),
            "outcome": _ref("Outcome"),
            "error": {"type": ["object", "null"]},
            "reply": {"type": ["string", "null"]},
            "attempt": {"type": "integer"},
            "accepted_at": {"type": "number"},
            "settled_at": {"type": ["number", "null"]},
        },
    },
    "Snapshot": {
        "type": "object",
        "required": ["conversation_id", "offset", "messages", "submissions"],
        "properties": {
            "conversation_id": {"type": "string"},
            "offset": {"type": "integer"},
            "first_offset": {
                "type": "integer",
                "description": "the offset of the first record the messages were folded from"
                " (0: the whole stream); page the earlier records through the stream route",
            },
            "messages": {"type": "array", "items": {"type": "object"}},
            "submissions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "status", "outcome"],
                    "properties": {"status": _ref("Status"), "outcome": _ref("Outcome")},
                },
            },
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
    "Fork": {
        "type": "object",
        "required": ["offset", "new_id"],
        "properties": {
            "offset": {
                "type": "integer",
                "minimum": 0,
                "description": "a rest point: a settlement's offset with no submission open at"
                " it, or 0",
            },
            "new_id": {"type": "string", "pattern": ID_PATTERN, "maxLength": 128},
        },
        "additionalProperties": False,
    },
    "Forked": {
        "type": "object",
        "required": ["conversation_id", "agent", "id", "offset"],
        "properties": {
            "conversation_id": {"type": "string"},
            "agent": {"type": "string"},
            "id": {"type": "string"},
            "offset": {"type": "integer"},
        },
    },
    "AbortResult": {
        "type": "object",
        "required": ["aborted", "submission_ids"],
        "properties": {
            "aborted": {"type": "boolean"},
            "submission_ids": {"type": "array", "items": {"type": "string"}},
        },
    },
    "Health": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"const": "ok"}},
    },
    "AdminView": {
        "type": "object",
        "required": [
            *("now", "owner", "counts", "outcomes"),
            *("unsettled", "recent", "leases", "stuck"),
        ],
        "properties": {
            "now": {"type": "number"},
            "owner": {"type": "string"},
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
            "outcomes": {"type": "object", "additionalProperties": {"type": "integer"}},
            "unsettled": {"type": "array", "items": {"type": "object"}},
            "recent": {"type": "array", "items": {"type": "object"}},
            "leases": {"type": "array", "items": {"type": "object"}},
            "stuck": {"type": "array", "items": {"type": "object"}},
        },
    },
}


def openapi_document(
    root_path: str = "",
    agents: Sequence[str] = (),
    *,
    token: bool = False,
    max_wait_s: float = MAX_WAIT_S,
) -> dict[str, Any]:
    """The description of this server: ``agents`` its agents' names, ``token`` whether a bearer
    token guards it."""
    conv = "/agents/{agent}/{id}"
    agent_schema: dict[str, Any] = {"type": "string"}
    if agents:
        agent_schema = {"type": "string", "enum": sorted(agents)}
    path_params = [
        {"name": "agent", "in": "path", "required": True, "schema": agent_schema},
        {
            "name": "id",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": ID_PATTERN, "maxLength": 128},
        },
    ]
    wait_q = {
        "name": "wait",
        "in": "query",
        "description": "long-poll up to this many seconds",
        "schema": {"type": "number", "minimum": 0, "maximum": max_wait_s},
    }

    def answers(ok: dict[str, dict[str, Any]], *errors: int) -> dict[str, Any]:
        return _answers(ok, *errors, token=token)

    paths: dict[str, Any] = {
        conv: {
            "parameters": path_params,
            "post": {
                "operationId": "admit",
                "summary": "Admit a message or signal",
                "description": (
                    "A message may carry files: as base64 `attachments` in JSON, or as"
                    " multipart/form-data with a `message` field, an optional"
                    " `idempotency_key` field and file parts (any field name)."
                ),
                "parameters": [
                    {
                        "name": "traceparent",
                        "in": "header",
                        "description": "W3C trace context; the submission's trace continues it",
                        "schema": {"type": "string"},
                    }
                ],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("Admission")}},
                },
                "responses": answers(
                    {
                        "202": {
                            **_json(_ref("Receipt"), "admitted durably"),
                            "links": {
                                "submission": {
                                    "operationId": "submission",
                                    "parameters": {
                                        "agent": "$request.path.agent",
                                        "id": "$request.path.id",
                                        "sid": "$response.body#/submission_id",
                                    },
                                }
                            },
                            "headers": {
                                "Location": {
                                    "description": "the stream_url",
                                    "schema": {"type": "string"},
                                }
                            },
                        }
                    },
                    400,
                    404,
                    408,
                    409,
                    413,
                    415,
                ),
            },
            "get": {
                "operationId": "snapshot",
                "summary": "Snapshot: messages and submissions",
                "responses": answers({"200": _json(_ref("Snapshot"), "snapshot")}, 400, 404),
            },
        },
        conv + "/stream": {
            "parameters": path_params,
            "get": {
                "operationId": "stream",
                "summary": "Records after offset, as a JSON page",
                "description": (
                    "With Accept: text/event-stream the same records come as server-sent events"
                    " (id: offset, data: the record's JSON) and the stream stays open; past"
                    " HEARTH_MAX_STREAMS open streams, 503."
                ),
                "parameters": [
                    {
                        "name": "offset",
                        "in": "query",
                        "schema": {
                            "type": "integer",
                            "minimum": -1,
                            "maximum": MAX_OFFSET,
                            "default": -1,
                        },
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": PAGE_LIMIT},
                    },
                    wait_q,
                ],
                "responses": answers({"200": _json(_ref("Page"), "a page of records")}, 400, 404),
            },
        },
        conv + "/submissions/{sid}": {
            "parameters": [
                *path_params,
                {
                    "name": "sid",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "pattern": SID_PATTERN},
                },
            ],
            "get": {
                "operationId": "submission",
                "summary": "A submission's status; ?wait=S long-polls for its settlement",
                "parameters": [wait_q],
                "responses": answers({"200": _json(_ref("Submission"), "status")}, 400, 404),
            },
        },
        conv + "/abort": {
            "parameters": path_params,
            "post": {
                "operationId": "abort",
                "summary": "Abort every unsettled submission of the conversation",
                "responses": answers(
                    {"200": _json(_ref("AbortResult"), "abort intents stamped")}, 400, 404, 409
                ),
            },
        },
        conv + "/fork": {
            "parameters": path_params,
            "post": {
                "operationId": "fork",
                "summary": "Fork the conversation at a rest point into a new conversation",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("Fork")}},
                },
                "responses": {
                    **answers(
                        {
                            "201": {
                                **_json(_ref("Forked"), "the new conversation"),
                                "headers": {
                                    "Location": {
                                        "description": "the new conversation's URL",
                                        "schema": {"type": "string"},
                                    }
                                },
                            }
                        },
                        400,
                        404,
                        408,
                        413,
                        415,
                    ),
                    "409": _json(
                        _ref("Error"),
                        "new_id exists (conversation_exists), or the offset is not a rest point"
                        " (not_a_rest_point; details.rest_points names the nearest)",
                    ),
                },
            },
        },
        conv + "/waits": {
            "parameters": path_params,
            "get": {
                "operationId": "conversation_waits",
                "summary": "The conversation's pending durable waits",
                "responses": answers({"200": _json(_ref("Waits"), "pending waits")}, 400, 404),
            },
        },
        conv + "/waits/{wait_id}": {
            "parameters": [
                *path_params,
                {"name": "wait_id", "in": "path", "required": True, "schema": {"type": "string"}},
            ],
            "post": {
                "operationId": "resolve_wait",
                "summary": "Resolve a durable wait with a JSON value (once; the same value again"
                " is 200)",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("Resolve")}},
                },
                "responses": {
                    **answers(
                        {
                            "200": _json(
                                _ref("Resolution"),
                                "resolved; the submission runs again once no wait of it is pending",
                            )
                        },
                        400,
                        404,
                        408,
                        413,
                        415,
                    ),
                    "409": _json(
                        _ref("Error"),
                        "resolved with another value, timed out, aborted, or its submission"
                        " no longer waits",
                    ),
                },
            },
        },
        "/waits": {
            "get": {
                "operationId": "waits",
                "summary": "Every pending durable wait, oldest first",
                "responses": answers({"200": _json(_ref("Waits"), "pending waits")}),
            }
        },
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "Health: serving, and the database answers (no token needed)",
                "security": [],
                "responses": _answers({"200": _json(_ref("Health"), "healthy")}, token=False),
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus text format",
                "responses": answers(
                    {
                        "200": {
                            "description": "metrics",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    }
                ),
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This description",
                "responses": answers({"200": _json({"type": "object"}, "OpenAPI 3.1")}),
            }
        },
        "/attachments/{sha256}": {
            "parameters": [
                {
                    "name": "sha256",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "pattern": SHA256_ASKED},
                }
            ],
            "get": {
                "operationId": "attachment",
                "summary": "A stored file's bytes, with the media type of its first copy",
                "responses": answers(
                    {
                        "200": {
                            "description": (
                                "the bytes (X-Content-Type-Options: nosniff, Content-Security-"
                                "Policy: sandbox; Content-Disposition: attachment unless a"
                                " raster image)"
                            ),
                            "content": {"*/*": {"schema": {}}},
                        }
                    },
                    400,
                    404,
                ),
            },
            "head": {
                "operationId": "attachment_head",
                "summary": "A stored file's size (Content-Length) and media type",
                "responses": {
                    "200": {"description": "stored"},
                    "400": {"description": "not 64 hex digits"},
                    "404": {"description": "not stored"},
                    **({"401": {"description": "no token"}} if token else {}),
                    "503": {"description": "unavailable"},
                },
            },
        },
        "/admin/gc": {
            "post": {
                "operationId": "collect_attachments",
                "summary": "Delete the attachments that no record or submission references",
                "parameters": [
                    {
                        "name": "dry_run",
                        "in": "query",
                        "description": "1: only list them",
                        "schema": {"enum": ["0", "1", "false", "true"]},
                    }
                ],
                "responses": answers({"200": _json(_ref("Collected"), "what was freed")}, 400),
            }
        },
        "/admin/submissions": {
            "get": {
                "operationId": "admin_submissions",
                "summary": "Submissions by status, leases, stuck work",
                "parameters": [
                    {
                        "name": "conversation",
                        "in": "query",
                        "description": "only this AGENT/ID",
                        "schema": {
                            "type": "string",
                            "pattern": "^[^/]+/" + ID_PATTERN.removeprefix("^"),
                        },
                    }
                ],
                "responses": answers({"200": _json(_ref("AdminView"), "admin view")}, 400, 404),
            }
        },
        "/conversations": {
            "get": {
                "operationId": "list_conversations",
                "summary": "Conversations, newest activity first, filtered and paged",
                "parameters": [
                    {"name": "agent", "in": "query", "schema": agent_schema},
                    {"name": "status", "in": "query", "schema": {"enum": ["active", "idle"]}},
                    {
                        "name": "after",
                        "in": "query",
                        "description": "the `next` of the previous page (empty: the first)",
                        "schema": {"type": "string", "pattern": "^$|" + CURSOR_RE.pattern},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
                    },
                ],
                "responses": answers({"200": _json(_ref("ConversationList"), "one page")}, 400),
            }
        },
        "/": {
            "get": {
                "operationId": "console",
                "summary": "The web console: the conversation list (HTML)",
                "responses": {
                    "200": _html("the page"),
                    **({"401": _html("the sign-in form")} if token else {}),
                },
            }
        },
        "/console/{agent}/{id}": {
            "parameters": path_params,
            "get": {
                "operationId": "console_conversation",
                "summary": "The web console: one conversation (HTML)",
                "responses": {
                    "200": _html("the page"),
                    "400": _json(_ref("Error"), "an id that breaks the id rule"),
                    "404": {
                        "description": "a conversation with no records yet (its page), or an"
                        " agent the app does not declare (an error)",
                        "content": {
                            "text/html": {"schema": {"type": "string"}},
                            "application/json": {"schema": _ref("Error")},
                        },
                    },
                    **({"401": _html("the sign-in form")} if token else {}),
                },
            },
        },
        "/console/session": {
            "post": {
                "operationId": "console_sign_in",
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
                    **_answers({}, 400, 403, 408, 413, 415, token=False),
                },
            }
        },
        "/console/logout": {
            "post": {
                "operationId": "console_sign_out",
                "summary": "Sign out of the console: clears the session cookie",
                "security": [],
                "responses": {
                    "303": {"description": "signed out"},
                    **_answers({}, 403, token=False),
                },
            }
        },
    }
    paths.update(_input_paths(answers))
    for path, item in paths.items():
        for method in ("post", "put", "patch", "delete"):
            if method in item and path != "/channels/{name}":  # (a channel's verify decides)
                forbidden = _json(_ref("Error"), _ERROR_WORDS[403])
                item[method]["responses"].setdefault("403", forbidden)
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "hearth", "version": __version__},
        "servers": [{"url": root_path or "/"}],
        "paths": paths,
        "components": {"schemas": _SCHEMAS},
    }
    if token:
        document["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "session": {"type": "apiKey", "in": "cookie", "name": "hearth_session"},
        }
        document["security"] = [{"bearer": []}, {"session": []}]
    return document


def _html(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"text/html": {"schema": {"type": "string"}}}}


Answers = Callable[..., dict[str, Any]]


def _input_paths(answers: Answers) -> dict[str, Any]:
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
                "operationId": "channel_delivery",
                "summary": "A webhook delivery, authenticated by the channel's verify",
                "security": [],
                "requestBody": {"required": True, "content": {"*/*": {"schema": {}}}},
                "responses": {
                    "202": _json(receipt, "every dispatch admitted, once per delivery id"),
                    "401": _json(_ref("Error"), "missing or wrong signature"),
                    "500": failed,
                    **_answers({}, 400, 404, 408, 413, token=False),
                },
            },
        },
        "/channels/{name}/deliveries": {
            "parameters": [
                name,
                {"name": "status", "in": "query", "schema": {"enum": ["admitted", "failed"]}},
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
                },
                {"name": "full", "in": "query", "schema": {"type": "boolean"}},
            ],
            "get": {
                "operationId": "channel_deliveries",
                "summary": "The channel's kept deliveries, newest first",
                "responses": answers({"200": _json(_ANY_JSON, "deliveries")}, 400, 404),
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
                "operationId": "channel_replay",
                "summary": "Route a failed delivery again (an admitted one is only answered)",
                "responses": {
                    **answers({"202": _json(receipt, "admitted")}, 400, 404),
                    "500": failed,
                },
            },
        },
        "/schedules": {
            "get": {
                "operationId": "schedules",
                "summary": "Each schedule with its last and next occurrence (UTC ISO)",
                "responses": answers({"200": _json(_ANY_JSON, "schedules")}),
            }
        },
    }
