"""The attachment value and its rules: media types (declared, sniffed, guessed), safe names,
the checks of ``rt.dispatch(attachments=...)``, and the parts a message's content holds."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import hearth
from hearth.attachments import (
    Attachment,
    check,
    is_sha256,
    media_type_of,
    message_content,
    parts_of,
    safe_name,
)
from hearth.errors import AttachmentTooLarge, InvalidInput
from hearth.records import UserMessage
from hearth.testing import ScriptedModel, reply


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


PNG_HEAD = bytes.fromhex("89504e470d0a1a0a0000000d49484452")
PDF = b"%PDF-1.7\n..."


@pytest.mark.parametrize(
    ("data", "name", "declared", "expected"),
    [
        (PNG_HEAD, "x", "image/png", "image/png"),
        (PNG_HEAD, "x", "Image/PNG; q=1", "image/png"),
        (PNG_HEAD, "x.txt", None, "image/png"),  # the bytes win over the name
        (PNG_HEAD, "x", "application/octet-stream", "image/png"),  # octet-stream is "unknown"
        (PDF, "a", None, "application/pdf"),
        (b"a,b\n1,2\n", "t.csv", None, "text/csv"),
        (b"plain words", "noext", None, "text/plain"),
        (b"\x00\x01\x02\xff", "noext", None, "application/octet-stream"),
    ],
)
def test_the_media_type_is_declared_else_sniffed_else_guessed(
    data: bytes, name: str, declared: str | None, expected: str
) -> None:
    assert media_type_of(data, name, declared) == expected


def test_a_declared_media_type_must_be_type_slash_subtype() -> None:
    with pytest.raises(InvalidInput, match="type/subtype"):
        media_type_of(b"x", "x", "png")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("report.pdf", "report.pdf"),
        ("../../etc/passwd", "____etc_passwd"),
        ("a/b\\c", "a_b_c"),
        ("bell\x07\nname\u200b.txt", "bellname.txt"),
        ("..", "_"),
        ("", "attachment"),
        (".hidden", "hidden"),
        ("x" * 400, "x" * 255),
        ("caf\udce9.txt", "caf\ufffd.txt"),  # read from a disk, not UTF-8: no JSON could carry it
    ],
)
def test_a_name_is_sanitised_never_a_path(given: str, expected: str) -> None:
    assert safe_name(given) == expected


def test_check_gives_the_part_records_hold() -> None:
    checked = check(Attachment(PDF, "dir/r.pdf"), 0, 1000)
    assert checked.part == {
        "type": "attachment",
        "sha256": hashlib.sha256(PDF).hexdigest(),
        "name": "dir_r.pdf",
        "media_type": "application/pdf",
        "size": len(PDF),
    }


def test_check_refuses_an_empty_file_and_names_one_too_large() -> None:
    with pytest.raises(InvalidInput, match="empty"):
        check(Attachment(b"", "e.txt"), 0, 1000)
    with pytest.raises(AttachmentTooLarge, match=r"'big\.bin' is 1001 bytes") as info:
        check(Attachment(b"x" * 1001, "big.bin"), 2, 1000)
    assert (info.value.name, info.value.size, info.value.limit) == ("big.bin", 1001, 1000)


def test_from_path_reads_the_file_and_takes_its_last_component(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    att = Attachment.from_path(tmp_path / "notes.txt")
    assert (att.data, att.name, att.media_type) == (b"hello", "notes.txt", None)
    assert att.sha256 == hashlib.sha256(b"hello").hexdigest() and att.size == 5


def test_content_holds_text_then_parts_and_a_string_without_files() -> None:
    part = check(Attachment(PDF, "r.pdf"), 0, 1000).part
    assert message_content("hi", []) == "hi"
    assert message_content("hi", [part]) == [{"type": "text", "text": "hi"}, part]
    assert message_content("", [part]) == [part]
    assert list(parts_of(message_content("hi", [part]))) == [part]
    assert list(parts_of("hi")) == []


def test_is_sha256_wants_64_lower_case_hex_digits() -> None:
    assert is_sha256("a" * 64)
    assert not is_sha256("A" * 64) and not is_sha256("a" * 63) and not is_sha256("g" * 64)


def _app(**settings: object) -> hearth.App:
    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/ok")
        return ""

    model = ScriptedModel("ok", [reply("ok")], repeat_last=True)
    return hearth.App(
        [hearth.Agent(render, name="files")], db="memory", providers=[model], **settings
    )


@pytest.mark.anyio
async def test_dispatch_admits_files_and_the_user_message_references_them() -> None:
    async with _app().run() as rt:
        receipt = await rt.dispatch("files", "c1", attachments=[Attachment(PDF, "r.pdf")])
        await rt.read(receipt, timeout=10)
        [message] = [r for r in await rt.history("files", "c1") if isinstance(r, UserMessage)]
        stored = await rt.attachment(hashlib.sha256(PDF).hexdigest())
    assert [p["name"] for p in parts_of(message.content)] == ["r.pdf"]
    assert stored.data == PDF and stored.media_type == "application/pdf"


@pytest.mark.anyio
async def test_dispatch_refuses_bad_attachments_and_stores_nothing() -> None:
    async with _app(max_attachment=100).run() as rt:
        with pytest.raises(InvalidInput, match=r"hearth\.Attachment"):
            await rt.dispatch("files", "c1", "x", attachments=[b"raw bytes"])  # type: ignore[list-item]
        with pytest.raises(InvalidInput, match=r"list of hearth\.Attachment"):
            await rt.dispatch("files", "c1", "x", attachments=Attachment(PDF))  # type: ignore[arg-type]
        with pytest.raises(AttachmentTooLarge):
            await rt.dispatch("files", "c1", "x", attachments=[Attachment(b"y" * 101, "big")])
        with pytest.raises(InvalidInput, match="not a signal"):
            await rt.dispatch("files", "c1", signal={"type": "t"}, attachments=[Attachment(PDF)])
        with pytest.raises(InvalidInput):
            await rt.dispatch("files", "c1", 7, attachments=[Attachment(PDF)])  # type: ignore[arg-type]
        assert await rt.submissions() == []
        assert await rt.collect_attachments(dry_run=True) == []


def test_a_text_reference_is_estimated_at_the_size_it_will_be_sent() -> None:
    """The turn loop estimates a request before the files are read: a text file must count at
    its size then too, or a request past the window would be sent."""
    from hearth.providers.parts import estimate_chars

    part = {
        "type": "attachment",
        "sha256": "0" * 64,
        "name": "app.log",
        "media_type": "text/plain",
        "size": 50_000,
    }
    assert estimate_chars(part) == 50_000
    assert estimate_chars({**part, "media_type": "image/png"}) == 6000


def test_the_sdk_sends_a_name_that_is_not_utf_8_as_a_label() -> None:
    """A file whose name is not UTF-8 (read from the disk with surrogate escapes) made the SDK's
    send and ``hearth send --attach`` fail with a UnicodeEncodeError."""
    from hearth.client._core import attachment_entry

    entry = attachment_entry(Attachment(b"x", "caf\udce9.txt", "text/plain"))
    assert entry["name"] == "caf\ufffd.txt"
    json.dumps(entry).encode()
