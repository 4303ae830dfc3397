"""An agent on the OpenAI provider, whose key comes from ``$OPENAI_API_KEY`` and whose model is
the fake server at ``$HEARTH_FAKE_LLM_URL``: for the test that greps a run's logs for secrets."""

from __future__ import annotations

import os
import sys

import hearth
import hearth.runtime.recovery
from hearth.providers import OpenAIProvider

hearth.runtime.recovery.BACKOFF_BASE_S = 0.01


@hearth.agent
def chat(ctx: hearth.AgentContext) -> str:
    ctx.use_model("openai/m")
    return "You are brief."


app = hearth.App(
    [chat],
    providers=[OpenAIProvider(f"{os.environ['HEARTH_FAKE_LLM_URL']}/v1", timeout=10.0)],
)

if os.environ.get("HEARTH_TEST_LEAK_KEY"):  # the planted fault of the leak test's own test
    print(f"debug: using key {os.environ['OPENAI_API_KEY']}", file=sys.stderr)
