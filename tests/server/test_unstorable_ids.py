"""An id in a path or a query parameter that no store can hold (a NUL, ``%00``) is answered as
an id that names nothing, alike on SQLite and PostgreSQL: PostgreSQL refused the query and the
answer was 503, as if the database were down."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import inputsapp
import pytest
from httpharness import ThreadServer
from pgcluster import Cluster, new_schema

import hearth


@pytest.fixture(params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ThreadServer]:
    if request.param == "sqlite":
        db = str(tmp_path / "h.db")
    else:
        cluster: Cluster = request.getfixturevalue("pg_cluster")
        db = cluster.url(new_schema())
    app = hearth.App(
        inputsapp.AGENTS,
        channels=inputsapp.CHANNELS,
        providers=inputsapp.MODELS,
        db=db,
        port=0,
    )
    started = ThreadServer(app).start()
    yield started
    started.stop()


@pytest.mark.parametrize(
    ("method", "path", "kind"),
    [
        ("GET", "/agents/triage/c1/submissions/a%00b", "submission_not_found"),
        ("POST", "/agents/triage/c1/waits/w%00", "wait_not_found"),
        ("POST", "/channels/hooks/deliveries/d%00/replay", "delivery_not_found"),
    ],
)
def test_an_id_with_a_nul_in_the_path_is_a_404(
    server: ThreadServer, method: str, path: str, kind: str
) -> None:
    with server.client() as http:
        assert http.post("/agents/triage/c1", json={"message": "hi"}).status_code == 202
        r = http.request(method, path, json={"value": 1} if "waits" in path else None)
    assert r.status_code == 404, r.text
    assert r.json()["error"]["type"] == kind


def test_a_conversation_with_a_nul_in_the_admin_view_is_a_400(server: ThreadServer) -> None:
    with server.client() as http:
        r = http.get("/admin/submissions", params={"conversation": "\x00x/c1"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["details"] == {"field": "conversation"}
