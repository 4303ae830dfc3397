"""Model providers: the interface, the OpenAI-compatible and Anthropic clients, context windows.

>>> from hearth.providers import default_providers
>>> [p.name for p in default_providers()]
['openai', 'anthropic']
"""

from __future__ import annotations

from hearth.providers.anthropic import AnthropicProvider
from hearth.providers.base import (
    AssistantTurn,
    Finished,
    Message,
    ModelEvent,
    ModelProvider,
    ModelRequest,
    SystemNote,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolResult,
    ToolSpec,
    UserTurn,
    estimate_tokens,
)
from hearth.providers.openai import OpenAIProvider
from hearth.providers.windows import CONTEXT_WINDOWS, context_window_for

__all__ = [
    "CONTEXT_WINDOWS",
    "AnthropicProvider",
    "AssistantTurn",
    "Finished",
    "Message",
    "ModelEvent",
    "ModelProvider",
    "ModelRequest",
    "OpenAIProvider",
    "SystemNote",
    "TextDelta",
    "ToolCall",
    "ToolCallEvent",
    "ToolResult",
    "ToolSpec",
    "UserTurn",
    "context_window_for",
    "default_providers",
    "estimate_tokens",
]


def default_providers() -> list[ModelProvider]:
    """A fresh ``[OpenAIProvider(), AnthropicProvider()]``.

    Nothing is read or opened here: base URLs and keys come from the environment when a request
    is made, and each provider creates its HTTP client on first use.
    """
    return [OpenAIProvider(), AnthropicProvider()]
