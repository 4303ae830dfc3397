"""Agents that talk to a fake model server over real HTTP, for crash tests of the providers.

The fake server runs in the test process; its address comes from ``$HEARTH_FAKE_LLM_URL``.
Backoff is shortened (``$HEARTH_TEST_BACKOFF_S``, default 10 ms) so retries do not slow tests.
"""

from __future__ import annotations

import os

import hearth
import hearth.runtime.recovery
from hearth.providers import AnthropicProvider, OpenAIProvider

hearth.runtime.recovery.BACKOFF_BASE_S = float(os.environ.get("HEARTH_TEST_BACKOFF_S", "0.01"))

URL = os.environ.get("HEARTH_FAKE_LLM_URL", "http://127.0.0.1:9")


@hearth.agent
def openai_chat(ctx: hearth.AgentContext) -> str:
    ctx.use_model("openai/m")
    return "You are brief."


@hearth.agent
def anthropic_chat(ctx: hearth.AgentContext) -> str:
    ctx.use_model("anthropic/claude-test")
    return "You are brief."


@hearth.agent
def openai_vision(ctx: hearth.AgentContext) -> str:
    ctx.use_model("openai/gpt-4o-mini")  # a model that takes images (the attachment tests)
    return "You are brief."


app = hearth.App(
    [openai_chat, anthropic_chat, openai_vision],
    providers=[
        OpenAIProvider(f"{URL}/v1", "sk-test", timeout=10.0, connect_timeout=2.0),
        AnthropicProvider(URL, "sk-ant-test", timeout=10.0, connect_timeout=2.0),
    ],
)
