"""What models see of attachments: the OpenAI-compatible client sends images as ``image_url``
data URLs, the Anthropic client ``image``/``document`` blocks; text files go inline (truncated
past the model's limit); anything a model cannot take is a note naming the file. The context
rebuilt after a SIGKILL carries the same image again, compaction keeps references only, and
tools read the files through ``ctx.attachments``."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest
from fakellm import FakeServer
from test_end_to_end import (
    Dialect,
    OpenAIDialect,
    bodies,
    crash_harness,
    of,
)
from test_end_to_end import dialect as dialect  # the fixture: every test runs on both clients
from test_end_to_end import fast_backoff as fast_backoff

import hearth
from hearth.attachments import Attachment
from hearth.providers import AnthropicProvider, OpenAIProvider
from hearth.providers.anthropic import anthropic_messages
from hearth.providers.base import ModelRequest, UserTurn
from hearth.providers.openai import chat_messages
from hearth.providers.parts import FilePart
from hearth.records import AssistantMessageCompleted, ToolOutcome
from hearth.runtime.admission import blobs_of, check_attachments, input_payload
from hearth.store import NewSubmission, open_store
from hearth.testing import ScriptedModel, call, calls, reply

pytestmark = pytest.mark.anyio

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
)
PDF = b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n"
PNG_B64 = base64.b64encode(PNG).decode()


def file(data: bytes, name: str, media_type: str) -> FilePart:
    import hashlib

    return FilePart(hashlib.sha256(data).hexdigest(), name, media_type, len(data), data)


def request(model: str, *parts: Any) -> ModelRequest:
    content = [{"type": "text", "text": "look"}, *parts]
    return ModelRequest(model=model, system="", messages=(UserTurn(content),))


# --- how each client renders files -----------------------------------------------------------


def test_openai_sends_an_image_as_a_data_url_to_a_model_that_takes_images() -> None:
    [message] = chat_messages(request("gpt-4o-mini", file(PNG, "dot.png", "image/png")))
    assert message["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
    ]


def test_openai_tells_a_text_only_model_about_the_image_in_a_note() -> None:
    [message] = chat_messages(request("llama3.1:8b", file(PNG, "dot.png", "image/png")))
    assert isinstance(message["content"], str)
    assert "[attachment dot.png (image/png" in message["content"]
    assert PNG_B64 not in message["content"]


def test_openai_notes_a_pdf_and_inlines_a_text_file() -> None:
    parts = (file(PDF, "r.pdf", "application/pdf"), file(b"a,b\n1,2\n", "t.csv", "text/csv"))
    [message] = chat_messages(request("gpt-4o", *parts))
    text = message["content"]
    assert "[attachment r.pdf (application/pdf" in text and "not shown" in text
    assert "[attachment t.csv (text/csv, 8 bytes)]\na,b\n1,2\n" in text


def test_anthropic_sends_image_and_document_blocks() -> None:
    parts = (file(PNG, "dot.png", "image/png"), file(PDF, "r.pdf", "application/pdf"))
    [turn] = anthropic_messages(request("claude-sonnet-4-5", *parts))
    image, document = turn["content"][1:]
    assert image == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64},
    }
    assert document["type"] == "document"
    assert base64.b64decode(document["source"]["data"]) == PDF


def test_anthropic_notes_files_a_model_cannot_take() -> None:
    parts = (file(PNG, "dot.png", "image/png"), file(b"\x00\x01", "x.bin", "application/zip"))
    [turn] = anthropic_messages(request("claude-2.1", *parts))
    texts = [b["text"] for b in turn["content"]]
    assert any("[attachment dot.png" in t for t in texts)
    assert any("[attachment x.bin (application/zip" in t for t in texts)


def test_a_long_text_file_is_cut_at_the_models_limit_with_a_note() -> None:
    long = ("line of text\n" * 5000).encode()
    provider = OpenAIProvider("http://127.0.0.1:9/v1", "k", context_windows={"small": 2000})
    body = provider.request_body(request("small", file(long, "log.txt", "text/plain")))
    text = body["messages"][0]["content"]
    assert f"truncated: the first 2000 of {len(long)} characters" in text
    assert len(text) < 2400


def test_a_reference_without_bytes_is_a_note() -> None:
    part = {"type": "attachment", "sha256": "a" * 64, "name": "gone.png",
            "media_type": "image/png", "size": 10}  # fmt: skip
    [message] = chat_messages(request("gpt-4o", part))
    assert "[attachment gone.png (image/png, 10 bytes" in message["content"]


# --- a real app talking to the fake servers ----------------------------------------------------


def vision_model(dialect: Dialect) -> str:
    return "openai/gpt-4o-mini" if isinstance(dialect, OpenAIDialect) else dialect.model


def sent_image(dialect: Dialect, body: dict[str, Any]) -> bytes | None:
    """The image bytes a request carries, in either wire format."""
    for m in body["messages"]:
        content = m.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if part.get("type") == "image_url":
                url = part["image_url"]["url"]
                return base64.b64decode(url.split(",", 1)[1])
            if part.get("type") == "image":
                return base64.b64decode(part["source"]["data"])
    return None


def helper_app(dialect: Dialect, url: str, **kw: Any) -> tuple[hearth.App, Any]:
    provider = (
        OpenAIProvider(f"{url}/v1", "sk-test", timeout=5.0, **kw)
        if isinstance(dialect, OpenAIDialect)
        else AnthropicProvider(url, "sk-ant-test", timeout=5.0, **kw)
    )
    model = vision_model(dialect)

    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model(model)
        return "You look at pictures."

    return hearth.App([hearth.Agent(render, name="looker")], db="memory", providers=[provider]), (
        provider
    )


async def test_a_dispatched_image_reaches_the_model(server: FakeServer, dialect: Dialect) -> None:
    app, provider = helper_app(dialect, server.url)
    server.sse(dialect.reply("a dot"))
    async with app.run() as rt:
        receipt = await rt.dispatch(
            "looker", "c1", "what is it?", attachments=[Attachment(PNG, "dot.png")]
        )
        assert (await rt.read(receipt, timeout=20)).text == "a dot"
    await provider.aclose()
    [body] = bodies(server)
    assert sent_image(dialect, body) == PNG
    assert "what is it?" in json.dumps(body)


async def test_compaction_keeps_the_reference_never_the_bytes(
    server: FakeServer, dialect: Dialect
) -> None:
    app, provider = helper_app(dialect, server.url)
    async with app.run() as rt:
        server.sse(dialect.reply("a dot"))
        first = await rt.dispatch("looker", "c1", "see", attachments=[Attachment(PNG, "dot.png")])
        await rt.read(first, timeout=20)
        server.error(400, dialect.overflow())
        server.sse(dialect.reply("The user showed a picture of a dot."))
        server.sse(dialect.reply("It was a dot."))
        assert (await rt.read(await rt.dispatch("looker", "c1", "what was it?"))).text
    await provider.aclose()
    _, overflowed, summary_request, retried = bodies(server)
    assert sent_image(dialect, overflowed) == PNG  # before compaction the model saw the image
    assert sent_image(dialect, summary_request) is None
    assert PNG_B64 not in json.dumps(summary_request)
    assert "[attachment dot.png (image/png" in json.dumps(summary_request)
    assert sent_image(dialect, retried) is None  # compacted away: only the summary remains


@pytest.mark.crash
def test_the_context_rebuilt_after_a_sigkill_carries_the_same_image(
    server: FakeServer, dialect: Dialect, tmp_path: Path
) -> None:
    harness = crash_harness(server, tmp_path)
    agent = "openai-vision" if isinstance(dialect, OpenAIDialect) else "anthropic-chat"
    checked = check_attachments([Attachment(PNG, "dot.png")], 1 << 20)
    kind, payload = input_payload("what is it?", None, checked)

    async def admit() -> None:
        store = open_store(f"sqlite:///{tmp_path / 'hearth.db'}")
        await store.open()
        try:
            new = NewSubmission(f"{agent}/c1", agent, kind, payload, blobs=blobs_of(checked))
            await store.admit(new)
        finally:
            await store.close()

    asyncio.run(admit())
    server.sse(dialect.partial("It is ", "a "), delay=0.2, end="hang")
    first = harness.run(crash_at="after:assistant_text_delta")
    assert first.killed
    server.sse(dialect.reply("dot."))
    assert harness.run().ok
    before, after = bodies(server)
    assert sent_image(dialect, before) == PNG
    assert sent_image(dialect, after) == PNG
    cut, done = of(harness.history(f"{agent}/c1"), AssistantMessageCompleted)
    assert cut.stop_reason == "aborted" and done.stop_reason == "stop"


# --- tools read the conversation's files --------------------------------------------------------


@hearth.tool
async def measure(name: str, ctx: hearth.ToolContext) -> dict[str, Any]:
    """Measure an attached file."""
    found = await ctx.attachments.read(name)
    return {"name": found.name, "size": len(found.data), "type": found.media_type,
            "listed": [p["name"] for p in ctx.attachments]}  # fmt: skip


async def test_a_tool_reads_an_attachment_by_name_and_by_sha256() -> None:
    notes = Attachment(b"three\nlines\nhere\n", "notes.txt")
    model = ScriptedModel(
        "reader",
        [
            calls(call("measure", name="notes.txt"), call("measure", name=Attachment(PDF).sha256),
                  call("measure", name="nope.txt")),
            reply("measured"),
        ],
    )  # fmt: skip

    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/reader")
        ctx.use_tool(measure)
        return ""

    app = hearth.App([hearth.Agent(render, name="reader")], db="memory", providers=[model])
    async with app.run() as rt:
        receipt = await rt.dispatch(
            "reader", "c1", "measure them", attachments=[notes, Attachment(PDF, "r.pdf")]
        )
        assert (await rt.read(receipt, timeout=20)).text == "measured"
        outcomes = of(await rt.history("reader", "c1"), ToolOutcome)
    [missing] = [o for o in outcomes if o.is_error]
    by_name, by_sha = sorted(
        (o for o in outcomes if not o.is_error), key=lambda o: o.content["name"] != "notes.txt"
    )
    assert by_name.content == {"name": "notes.txt", "size": 17, "type": "text/plain",
                               "listed": ["notes.txt", "r.pdf"]}  # fmt: skip
    assert by_sha.content["name"] == "r.pdf" and by_sha.content["type"] == "application/pdf"
    assert missing.is_error and "nope.txt" in missing.content["message"]
