"""Random methods, paths, headers and bodies never get a 5xx."""

from __future__ import annotations

import json
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2
import pytest
from httpharness import ThreadServer, make_app
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    db: Path = tmp_path_factory.mktemp("fuzz") / "h.db"
    server = ThreadServer(make_app(db, max_body=4096)).start()
    with httpx2.Client(base_url=server.url) as http:  # one conversation that exists
        http.post("/agents/echo/known", json={"message": "hi"})
    yield server
    server.stop()


header_text = st.text(alphabet=string.printable.strip() + " ", max_size=40)
segment = st.one_of(
    st.sampled_from(["echo", "staller", "nobody", "known", "c-1", "..", "stream", "abort"]),
    st.text(max_size=20),
)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
body = st.one_of(
    st.binary(max_size=200),
    json_value.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {},
        optional={
            "message": json_value,
            "signal": json_value,
            "idempotency_key": st.one_of(st.text(max_size=300), json_value),
        },
    ).map(lambda v: json.dumps(v).encode()),
    st.just(b"x" * 5000),
)


@st.composite
def paths(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        agent = draw(st.sampled_from(["echo", "staller", "nobody"]) | segment)
        conv = draw(st.sampled_from(["known", "c-1"]) | segment)
        suffix = draw(
            st.sampled_from(["", "/stream", "/abort", "/submissions/s_x"])
            | segment.map(lambda s: "/" + quote(s, safe=""))
        )
        return f"/agents/{quote(agent, safe='')}/{quote(conv, safe='')}{suffix}"
    parts = draw(st.lists(segment, max_size=5))
    return "/" + "/".join(quote(p, safe="") for p in parts)


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    headers: dict[str, str] = {}
    if draw(st.booleans()):
        headers["content-type"] = draw(
            st.sampled_from(["application/json", "text/plain", "application/ld+json"]) | header_text
        )
    if draw(st.booleans()):
        headers["accept"] = draw(st.sampled_from(["text/event-stream", "*/*"]) | header_text)
    if draw(st.booleans()):
        headers["last-event-id"] = draw(header_text)
    if draw(st.booleans()):
        headers["authorization"] = draw(header_text)
    params = draw(
        st.dictionaries(
            st.sampled_from(["offset", "wait", "limit", "conversation", "x"]),
            st.sampled_from(["0", "-1", "5", "0.1", "1e999", "nan"]) | header_text,
            max_size=3,
        )
    )
    if "wait" in params:
        params["wait"] = "0"  # long-polls stay short
    return {
        "method": draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"])),
        "url": draw(paths()),
        "headers": headers,
        "params": params,
        "content": draw(body),
    }


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(request=requests())
def test_random_requests_never_get_a_5xx(
    fuzz_server: ThreadServer, request: dict[str, Any]
) -> None:
    request = {**request, "url": fuzz_server.url + request["url"]}
    with httpx2.Client(timeout=10) as http:
        try:
            with http.stream(**request) as response:
                status = response.status_code
                if "text/event-stream" not in response.headers.get("content-type", ""):
                    response.read()
        except (httpx2.LocalProtocolError, httpx2.InvalidURL):
            return  # the client itself refused to send it
    assert status < 500, (request, status)
