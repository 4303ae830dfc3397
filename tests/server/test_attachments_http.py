"""Attachments over HTTP, against a real server on a loopback port and its real SQLite file:
JSON with base64 and multipart admission, the content-addressed store behind
``/attachments/{sha256}``, references in records, limits, and bad input that stores nothing."""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest
from httpharness import ThreadServer, wait_until

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
)
PDF = b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def db_rows(server: ThreadServer, sql: str) -> list[tuple[Any, ...]]:
    """Rows of the server's SQLite file, read after the server stopped (it owns the file)."""
    server.stop()
    path = server.app.settings.db
    assert path is not None
    with sqlite3.connect(path.removeprefix("sqlite:///")) as conn:
        rows = conn.execute(sql).fetchall()
    conn.close()
    return rows


def records(server: ThreadServer, conv: str = "c-1") -> list[dict[str, Any]]:
    with server.client() as http:
        return list(http.get(f"/agents/echo/{conv}/stream").json()["records"])


def user_parts(server: ThreadServer, conv: str = "c-1") -> Any:
    [message] = [r for r in records(server, conv) if r["type"] == "user_message"]
    return message["content"]


def test_a_json_admission_with_base64_stores_the_bytes_and_references_them(
    server: ThreadServer,
) -> None:
    body = {
        "message": "what is this?",
        "attachments": [{"name": "dot.png", "media_type": "image/png", "data": b64(PNG)}],
    }
    with server.client() as http:
        answer = http.post("/agents/echo/c-1", json=body)
        assert answer.status_code == 202, answer.text
        got = http.get(f"/attachments/{sha(PNG)}")
        head = http.head(f"/attachments/{sha(PNG)}")
        upper = http.get(f"/attachments/{sha(PNG).upper()}")  # was a 400
    assert got.status_code == 200 and got.content == PNG
    assert upper.status_code == 200 and upper.content == PNG
    assert upper.headers["etag"] == f'"{sha(PNG)}"'
    assert got.headers["content-type"] == "image/png"
    assert got.headers["x-content-type-options"] == "nosniff"
    assert got.headers["content-security-policy"] == "sandbox"
    assert "content-disposition" not in got.headers  # a raster image is shown inline
    assert head.status_code == 200 and head.headers["content-length"] == str(len(PNG))
    assert head.content == b""
    wait_until(lambda: any(r["type"] == "user_message" for r in records(server)))
    assert user_parts(server) == [
        {"type": "text", "text": "what is this?"},
        {
            "type": "attachment",
            "sha256": sha(PNG),
            "name": "dot.png",
            "media_type": "image/png",
            "size": len(PNG),
        },
    ]


def test_a_multipart_admission_takes_a_message_field_and_files(server: ThreadServer) -> None:
    files = [
        ("file", ("report.pdf", PDF, "application/pdf")),
        ("file", ("notes.txt", b"line one\n", "text/plain")),
    ]
    with server.client() as http:
        answer = http.post("/agents/echo/c-1", data={"message": "two files"}, files=files)
        assert answer.status_code == 202, answer.text
        pdf = http.get(f"/attachments/{sha(PDF)}")
    assert pdf.headers["content-type"] == "application/pdf"
    assert pdf.headers["content-disposition"] == "attachment"
    wait_until(lambda: any(r["type"] == "user_message" for r in records(server)))
    parts = user_parts(server)
    assert parts[0] == {"type": "text", "text": "two files"}
    assert [(p["name"], p["media_type"]) for p in parts[1:]] == [
        ("report.pdf", "application/pdf"),
        ("notes.txt", "text/plain"),
    ]


def test_a_message_of_files_alone_is_accepted(server: ThreadServer) -> None:
    with server.client() as http:
        answer = http.post("/agents/echo/c-1", files=[("file", ("a.pdf", PDF, "application/pdf"))])
    assert answer.status_code == 202, answer.text
    wait_until(lambda: any(r["type"] == "user_message" for r in records(server)))
    [part] = user_parts(server)
    assert part["type"] == "attachment" and part["sha256"] == sha(PDF)


def test_a_missing_media_type_is_sniffed_and_an_unsafe_name_sanitised(
    server: ThreadServer,
) -> None:
    body = {"message": "x", "attachments": [{"name": "../../etc/\x00pass\nwd", "data": b64(PNG)}]}
    with server.client() as http:
        assert http.post("/agents/echo/c-1", json=body).status_code == 202
    wait_until(lambda: any(r["type"] == "user_message" for r in records(server)))
    part = user_parts(server)[1]
    assert part["media_type"] == "image/png"
    assert "/" not in part["name"] and ".." not in part["name"] and "\n" not in part["name"]
    assert part["name"] == "____etc_passwd"


def test_the_same_bytes_sent_twice_are_stored_once(server: ThreadServer) -> None:
    body = {"message": "x", "attachments": [{"name": "a.pdf", "data": b64(PDF)}]}
    with server.client() as http:
        for conv in ("c-1", "c-2", "c-1"):
            assert http.post(f"/agents/echo/{conv}", json=body).status_code == 202
    assert db_rows(server, "SELECT sha256, length(data) FROM attachments") == [(sha(PDF), len(PDF))]


def test_a_ten_megabyte_attachment_keeps_the_stream_small(server: ThreadServer) -> None:
    big = bytes(range(256)) * (10 * 1024 * 1024 // 256)
    with server.client() as http:
        answer = http.post(
            "/agents/echo/c-1",
            data={"message": "big"},
            files=[("file", ("big.bin", big, "application/octet-stream"))],
        )
        assert answer.status_code == 202, answer.text
    wait_until(lambda: any(r["type"] == "submission_settled" for r in records(server)))
    [(body_bytes, total)] = db_rows(
        server,
        "SELECT (SELECT max(length(body)) FROM records), (SELECT sum(length(body)) FROM records)",
    )
    assert body_bytes < 2000 and total < 10_000
    [(size,)] = db_rows(server, "SELECT length(data) FROM attachments")
    assert size == len(big)


def test_a_stream_reader_gets_the_reference_over_sse(server: ThreadServer) -> None:
    from httpharness import sse_records

    body = {"message": "x", "attachments": [{"name": "a.pdf", "data": b64(PDF)}]}
    with server.client() as http:
        assert http.post("/agents/echo/c-1", json=body).status_code == 202
        with http.stream(
            "GET", "/agents/echo/c-1/stream", headers={"Accept": "text/event-stream"}
        ) as response:
            for _, record in sse_records(response):
                if record["type"] == "user_message":
                    assert record["content"][1]["sha256"] == sha(PDF)
                    assert "data" not in record["content"][1]
                    break


# --- what is refused, and stores nothing ----------------------------------------------------
BAD_JSON = {
    "invalid base64": [{"name": "a", "data": "not base64!!"}],
    "an empty file": [{"name": "a", "data": ""}],
    "an entry that is not an object": ["aGVsbG8="],
    "attachments that are not a list": {"name": "a", "data": "aGVsbG8="},
    "an unknown entry field": [{"name": "a", "data": "aGVsbG8=", "path": "/etc"}],
    "a media type that is not type/subtype": [{"data": "aGVsbG8=", "media_type": "png"}],
}


@pytest.mark.parametrize("case", sorted(BAD_JSON))
def test_bad_json_attachments_are_a_400_and_store_nothing(server: ThreadServer, case: str) -> None:
    with server.client() as http:
        answer = http.post("/agents/echo/c-1", json={"message": "x", "attachments": BAD_JSON[case]})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["type"] == "invalid_request"
    assert db_rows(server, "SELECT count(*) FROM attachments") == [(0,)]


def test_a_multipart_body_with_neither_message_nor_file_is_a_400(server: ThreadServer) -> None:
    with server.client() as http:
        answer = http.post(
            "/agents/echo/c-1", data={"idempotency_key": "k"}, files={"x": ("", b"", "")}
        )
        answer2 = http.post(
            "/agents/echo/c-1",
            content=b'--b\r\nContent-Disposition: form-data; name="idempotency_key"\r\n\r\nk'
            b"\r\n--b--\r\n",
            headers={"Content-Type": "multipart/form-data; boundary=b"},
        )
    assert answer.status_code == 400, answer.text
    assert answer2.status_code == 400, answer2.text
    assert answer2.json()["error"]["details"] == {"field": "message"}
    assert db_rows(server, "SELECT count(*) FROM submissions") == [(0,)]


def test_a_form_field_that_is_not_utf8_is_a_400_and_utf8_is_kept(server: ThreadServer) -> None:
    """Bytes that are not UTF-8 were read as Latin-1 and stored as the message."""

    def form(message: bytes) -> bytes:
        return (
            b'--b\r\nContent-Disposition: form-data; name="message"\r\n\r\n'
            + message
            + b'\r\n--b\r\nContent-Disposition: form-data; name="f"; filename="a.txt"\r\n'
            b"Content-Type: text/plain\r\n\r\nhello\r\n--b--\r\n"
        )

    headers = {"Content-Type": "multipart/form-data; boundary=b"}
    with server.client() as http:
        refused = http.post("/agents/echo/c-1", content=form(b"caf\xe9"), headers=headers)
        assert refused.status_code == 400, refused.text
        assert "'message' is not utf-8 text" in refused.json()["error"]["message"]
        kept = http.post("/agents/echo/c-1", content=form("café".encode()), headers=headers)
        assert kept.status_code == 202, kept.text
    wait_until(lambda: any(r["type"] == "user_message" for r in records(server)))
    assert user_parts(server)[0] == {"type": "text", "text": "café"}
    assert db_rows(server, "SELECT count(*) FROM submissions") == [(1,)]  # the refused: none


MESSAGE_PART = b'--b\r\nContent-Disposition: form-data; name="message"\r\n\r\nsee the file'
FILE_PART = (
    b'\r\n--b\r\nContent-Disposition: form-data; name="f"; filename="a.txt"\r\n'
    b"Content-Type: text/plain\r\n\r\nhello"
)


@pytest.mark.parametrize("end", [b"", b"\r\n", b"\r\n--b", b"\r\n--b-"])
def test_a_multipart_body_cut_before_its_closing_boundary_is_a_400(
    server: ThreadServer, end: bytes
) -> None:
    """Its last part was left out (or its text cut) and the rest admitted with a 202."""
    headers = {"Content-Type": "multipart/form-data; boundary=b"}
    with server.client() as http:
        cut = http.post("/agents/echo/c-1", content=MESSAGE_PART + FILE_PART + end, headers=headers)
        message_cut = http.post("/agents/echo/c-1", content=MESSAGE_PART + end, headers=headers)
        whole = http.post(
            "/agents/echo/c-2", content=MESSAGE_PART + FILE_PART + b"\r\n--b--\r\n", headers=headers
        )
    for answer in (cut, message_cut):
        assert answer.status_code == 400, answer.text
        assert "closing boundary" in answer.json()["error"]["message"]
    assert whole.status_code == 202, whole.text
    assert db_rows(server, "SELECT conversation_id FROM submissions") == [("echo/c-2",)]


def test_a_multipart_body_in_a_charset_nobody_knows_is_a_400(server: ThreadServer) -> None:
    """It was read as Latin-1: the bytes FF FE were stored as the message "ÿþ"."""
    form = b'--b\r\nContent-Disposition: form-data; name="message"\r\n\r\n\xff\xfe\r\n--b--\r\n'
    with server.client() as http:
        answer = http.post(
            "/agents/echo/c-1",
            content=form,
            headers={"Content-Type": "multipart/form-data; boundary=b; charset=nope"},
        )
    assert answer.status_code == 400, answer.text
    assert "unknown charset 'nope'" in answer.json()["error"]["message"]
    assert db_rows(server, "SELECT count(*) FROM submissions") == [(0,)]


def test_a_multipart_message_is_held_to_the_body_limit_as_a_json_one_is(
    serve_app: Callable[..., ThreadServer],
) -> None:
    """The form's message went past HEARTH_MAX_BODY, with a file or without; and past 1 MiB a
    default server answered a 400 naming the form parser's own limit."""
    server = serve_app(max_upload=50_000, max_body=2_000)
    with server.client() as http:
        alone = http.post("/agents/echo/c-1", files={"message": (None, "y" * 4_500)})
        beside = http.post(
            "/agents/echo/c-2",
            data={"message": "y" * 3_000},
            files={"f": ("a.txt", b"hello", "text/plain")},
        )
        within = http.post(
            "/agents/echo/c-3",
            data={"message": "y" * 1_000},
            files={"f": ("a.txt", b"y" * 20_000, "text/plain")},
        )
    for answer in (alone, beside):
        assert answer.status_code == 413, answer.text
        assert answer.json()["error"]["type"] == "payload_too_large"
        assert "HEARTH_MAX_BODY" in answer.json()["error"]["message"]
    assert within.status_code == 202, within.text
    assert db_rows(server, "SELECT conversation_id FROM submissions") == [("echo/c-3",)]


def test_an_empty_uploaded_file_is_a_400(server: ThreadServer) -> None:
    with server.client() as http:
        answer = http.post(
            "/agents/echo/c-1", data={"message": "x"}, files={"file": ("e.txt", b"", "text/plain")}
        )
    assert answer.status_code == 400, answer.text
    assert db_rows(server, "SELECT count(*) FROM submissions") == [(0,)]


@pytest.mark.parametrize("bad", ["abc", "0" * 63, "g" * 64, "0" * 65, "\u212a" + "a" * 63])
def test_a_sha256_that_is_not_64_hex_digits_is_a_400(server: ThreadServer, bad: str) -> None:
    with server.client() as http:
        answer = http.get(f"/attachments/{bad}")
    assert answer.status_code == 400
    assert answer.json()["error"]["type"] == "invalid_request"


def test_an_unknown_attachment_is_a_404(server: ThreadServer) -> None:
    with server.client() as http:
        answer = http.get(f"/attachments/{'0' * 64}")
        head = http.head(f"/attachments/{'0' * 64}")
    assert answer.status_code == 404 and head.status_code == 404
    assert answer.json()["error"]["type"] == "attachment_not_found"


def test_a_file_over_the_attachment_limit_is_a_413_naming_it(
    serve_app: Callable[..., ThreadServer],
) -> None:
    server = serve_app(max_attachment=1000)
    with server.client() as http:
        as_json = http.post(
            "/agents/echo/c-1",
            json={"message": "x", "attachments": [{"name": "huge.bin", "data": b64(b"x" * 2000)}]},
        )
        as_form = http.post(
            "/agents/echo/c-1",
            data={"message": "x"},
            files=[("file", ("ok.txt", b"fine", "text/plain")),
                   ("file", ("huge.bin", b"x" * 2000, "application/octet-stream"))],
        )  # fmt: skip
    for answer in (as_json, as_form):
        assert answer.status_code == 413, answer.text
        error = answer.json()["error"]
        assert error["type"] == "attachment_too_large" and "huge.bin" in error["message"]
        assert "HEARTH_MAX_ATTACHMENT" in error["message"]
        # Both say the size, as base64 too (the SDK's AttachmentTooLarge.size read 0).
        assert error["details"] == {"name": "huge.bin", "size": 2000, "limit": 1000}
        assert "is 2000 bytes" in error["message"]
    assert db_rows(server, "SELECT count(*) FROM attachments") == [(0,)]


def test_a_request_over_the_upload_limit_is_a_413(
    serve_app: Callable[..., ThreadServer],
) -> None:
    server = serve_app(max_upload=50_000, max_body=10_000)
    with server.client() as http:
        over = http.post(
            "/agents/echo/c-1", data={"message": "x"}, files={"f": ("a", b"y" * 60_000, "x/y")}
        )
        within = http.post(
            "/agents/echo/c-1", data={"message": "x"}, files={"f": ("a", b"y" * 20_000, "x/y")}
        )
        plain = http.post("/agents/echo/c-2", json={"message": "y" * 20_000})
        # A file of one byte let the message take the upload limit (a 20 MiB user_message).
        carried = {"message": "y" * 20_000, "attachments": [{"name": "a", "data": b64(b"1")}]}
        carrying = http.post("/agents/echo/c-3", json=carried)
        small = {"message": "y" * 5_000, "attachments": [{"name": "a", "data": b64(b"y" * 20_000)}]}
        beside = http.post("/agents/echo/c-4", json=small)
    assert over.status_code == 413 and "HEARTH_MAX_UPLOAD" in over.json()["error"]["message"]
    assert within.status_code == 202, within.text
    for answer in (plain, carrying):
        assert answer.status_code == 413 and "HEARTH_MAX_BODY" in answer.json()["error"]["message"]
    assert beside.status_code == 202, beside.text


def test_a_json_body_over_the_body_limit_without_attachments_is_a_413_unparsed(
    serve_app: Callable[..., ThreadServer],
) -> None:
    """Without "attachments" in it, a body over HEARTH_MAX_BODY is refused as it is read: it
    was parsed first, up to HEARTH_MAX_UPLOAD (here unfinished JSON answered 400, not 413)."""
    server = serve_app(max_upload=50_000, max_body=10_000)
    unfinished = b'{"message": "hi", "pad": [' + b"{}," * 5_000
    with server.client() as http:
        headers = {"content-type": "application/json"}
        r = http.post("/agents/echo/c-1", content=unfinished, headers=headers)
        assert r.status_code == 413 and "HEARTH_MAX_BODY" in r.json()["error"]["message"]
        small = {"message": "x", "attachments": [{"name": "a", "data": b64(b"y" * 20_000)}]}
        assert http.post("/agents/echo/c-2", json=small).status_code == 202  # files still may


def test_a_json_body_declared_over_the_body_limit_without_attachments_is_refused_early(
    serve_app: Callable[..., ThreadServer],
) -> None:
    """A JSON admission with no attachments was read up to HEARTH_MAX_UPLOAD before its 413:
    a client declaring 30 MB and stalling before the end got no answer until the body
    deadline, and ten such clients held 600 MB. It is refused once HEARTH_MAX_BODY is read."""
    import socket

    server = serve_app(max_upload=50 << 20, max_body=10_000)
    host, port = server.url.removeprefix("http://").split(":")
    head = (
        b"POST /agents/echo/c-1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % (30 << 20)
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + b'{"message": "' + b"a" * 200_000)  # then it stalls
        answer = sock.recv(65536)  # (it hung for the 30 s body deadline, then 408)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"HEARTH_MAX_BODY" in answer
    with server.client() as http:
        assert http.get("/agents/echo/c-1").status_code == 404  # nothing admitted


def test_only_a_body_whose_first_bytes_show_attachments_may_pass_the_body_limit(
    serve_app: Callable[..., ThreadServer],
) -> None:
    server = serve_app(max_upload=50_000, max_body=10_000)
    files = [{"name": "a", "data": b64(b"y" * 20_000)}]
    with server.client() as http:
        first = http.post("/agents/echo/c-1", json={"attachments": files, "message": "x"})
        after = http.post("/agents/echo/c-2", json={"message": "x" * 5_000, "attachments": files})
        late = http.post("/agents/echo/c-3", json={"message": "x" * 12_000, "attachments": files})
    assert first.status_code == 202 and after.status_code == 202, (first.text, after.text)
    # The key past the first HEARTH_MAX_BODY bytes: its message alone is over that limit.
    assert late.status_code == 413 and "HEARTH_MAX_BODY" in late.json()["error"]["message"]


def test_attachments_are_behind_the_token(serve_app: Callable[..., ThreadServer]) -> None:
    server = serve_app(token="s3cret")
    auth = {"Authorization": "Bearer s3cret"}
    body = {"message": "x", "attachments": [{"name": "a.pdf", "data": b64(PDF)}]}
    with server.client() as http:
        assert http.post("/agents/echo/c-1", json=body).status_code == 401
        assert http.post("/agents/echo/c-1", json=body, headers=auth).status_code == 202
        assert http.get(f"/attachments/{sha(PDF)}").status_code == 401
        assert http.head(f"/attachments/{sha(PDF)}").status_code == 401
        assert http.post("/admin/gc").status_code == 401
        assert http.get(f"/attachments/{sha(PDF)}", headers=auth).content == PDF


def test_admin_gc_frees_only_what_nothing_references(server: ThreadServer) -> None:
    body = {"message": "x", "attachments": [{"name": "a.pdf", "data": b64(PDF)}]}
    with server.client() as http:
        assert http.post("/agents/echo/c-1", json=body).status_code == 202
        answer = http.post("/admin/gc")
    assert answer.status_code == 200
    assert answer.json() == {"dry_run": False, "deleted": [], "count": 0, "bytes": 0}


def test_an_idempotent_repeat_with_the_same_files_is_deduplicated(server: ThreadServer) -> None:
    body = {
        "message": "x",
        "idempotency_key": "k1",
        "attachments": [{"name": "a.pdf", "data": b64(PDF)}],
    }
    other = json.loads(json.dumps(body))
    other["attachments"][0]["data"] = b64(PNG)
    with server.client() as http:
        first = http.post("/agents/echo/c-1", json=body).json()
        again = http.post("/agents/echo/c-1", json=body).json()
        conflict = http.post("/agents/echo/c-1", json=other)
    assert again["deduplicated"] and again["submission_id"] == first["submission_id"]
    assert conflict.status_code == 409
    assert db_rows(server, "SELECT sha256 FROM attachments") == [(sha(PDF),)]


def test_a_signal_with_attachments_is_a_400(server: ThreadServer) -> None:
    body = {"signal": {"type": "ping"}, "attachments": [{"name": "a.pdf", "data": b64(PDF)}]}
    with server.client() as http:
        answer = http.post("/agents/echo/c-1", json=body)
    assert answer.status_code == 400
    assert db_rows(server, "SELECT count(*) FROM attachments") == [(0,)]
