"""Context windows of common models, and the lookup the providers use.

Names are matched by their alphanumeric tokens (``"Meta-Llama-3.1-8B-Instruct"`` →
``meta llama 3 1 8 b instruct``), so one entry covers dated snapshots, quantisation tags
(``"qwen2.5:7b"``), hub prefixes (``"Qwen/Qwen2.5-7B-Instruct"``) and fine-tunes
(``"ft:gpt-4o-mini:org::id"``). The entry with the most tokens that appears in the name wins.

Local servers often run a model with a smaller window than the model supports (Ollama's default
is a few thousand tokens): pass ``context_windows={...}`` to the provider to say what yours uses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = [
    "CONTEXT_WINDOWS",
    "DEFAULT_ANTHROPIC_WINDOW",
    "DEFAULT_OPENAI_WINDOW",
    "IMAGE_INPUT",
    "context_window_for",
    "takes_images",
]

DEFAULT_OPENAI_WINDOW = 8192  # an unknown OpenAI-compatible (often local) model
DEFAULT_ANTHROPIC_WINDOW = 200_000  # an unknown Claude model

CONTEXT_WINDOWS: dict[str, int] = {
    # OpenAI
    "gpt-5": 400_000,
    "gpt-5-chat": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "chatgpt-4o": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-4-1106": 128_000,
    "gpt-4-0125": 128_000,
    "gpt-4": 8_192,
    "gpt-4-32k": 32_768,
    "gpt-3.5-turbo": 16_385,
    "o1": 200_000,
    "o1-mini": 128_000,
    "o1-preview": 128_000,
    "o3": 200_000,
    "o3-mini": 200_000,
    "o4-mini": 200_000,
    "gpt-oss": 131_072,
    # Anthropic
    "claude": 200_000,
    "claude-2": 100_000,
    "claude-instant": 100_000,
    "claude-3-haiku": 200_000,
    "claude-3-sonnet": 200_000,
    "claude-3-opus": 200_000,
    "claude-3-5-haiku": 200_000,
    "claude-3-5-sonnet": 200_000,
    "claude-3-7-sonnet": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-opus-4": 200_000,
    "claude-haiku-4": 200_000,
    "claude-sonnet-4-5": 200_000,
    "claude-opus-4-1": 200_000,
    "claude-opus-4-5": 200_000,
    "claude-haiku-4-5": 200_000,
    # open-weight models, as served by Ollama, vLLM, llama.cpp, LM Studio
    "llama2": 4_096,
    "llama3": 8_192,
    "llama3.1": 131_072,
    "llama3.2": 131_072,
    "llama3.3": 131_072,
    "qwen2": 32_768,
    "qwen2.5": 32_768,
    "qwen2.5-coder": 32_768,
    "qwen3": 40_960,
    "mistral": 32_768,
    "mistral-nemo": 131_072,
    "mistral-small": 32_768,
    "mistral-large": 131_072,
    "mixtral": 32_768,
    "codestral": 32_768,
    "gemma": 8_192,
    "gemma2": 8_192,
    "gemma3": 131_072,
    "phi3": 4_096,
    "phi3.5": 131_072,
    "phi4": 16_384,
    "deepseek": 131_072,
    "smollm": 2_048,
    "smollm2": 8_192,
    "tinyllama": 2_048,
}

_TOKEN = re.compile(r"[a-z]+|[0-9]+")


def _tokens(name: str) -> tuple[str, ...]:
    return tuple(_TOKEN.findall(name.lower()))


def _contains(haystack: tuple[str, ...], needle: tuple[str, ...]) -> bool:
    width = len(needle)
    return width > 0 and any(
        haystack[i : i + width] == needle for i in range(len(haystack) - width + 1)
    )


def _best_match(model: str, table: Mapping[str, int]) -> int | None:
    if model in table:
        return table[model]
    name = _tokens(model)
    best: tuple[int, int] | None = None  # (token count, window) of the best entry so far
    for key, window in table.items():
        key_tokens = _tokens(key)
        if _contains(name, key_tokens) and (best is None or len(key_tokens) > best[0]):
            best = (len(key_tokens), window)
    return None if best is None else best[1]


def context_window_for(
    model: str,
    *,
    default: int,
    overrides: Mapping[str, int] | None = None,
) -> int:
    """The context window of ``model``: ``overrides`` first, then the built-in table.

    An ``overrides`` key matches like a table entry; the key ``"*"`` replaces ``default``.

    >>> context_window_for("gpt-4o-mini-2024-07-18", default=8192)
    128000
    >>> context_window_for("llama3.2:3b", default=8192, overrides={"llama3.2": 4096})
    4096
    """
    if overrides:
        named = {k: v for k, v in overrides.items() if k != "*"}
        found = _best_match(model, named)
        if found is not None:
            return found
        default = overrides.get("*", default)
    found = _best_match(model, CONTEXT_WINDOWS)
    return default if found is None else found


# Which models take images (and, on Anthropic, PDF documents), matched like the windows above;
# a model in neither table gets the provider's default. Others see a note naming the file.
IMAGE_INPUT: dict[str, bool] = {
    "gpt-5": True,
    "gpt-4.1": True,
    "gpt-4o": True,
    "chatgpt-4o": True,
    "gpt-4-turbo": True,
    "gpt-4": False,
    "gpt-3.5-turbo": False,
    "o1": True,
    "o1-mini": False,
    "o1-preview": False,
    "o3": True,
    "o3-mini": False,
    "o4-mini": True,
    "gpt-oss": False,
    "claude": True,
    "claude-2": False,
    "claude-instant": False,
    "llava": True,
    "bakllava": True,
    "llama3.2-vision": True,
    "llama4": True,
    "qwen2.5-vl": True,
    "qwen2-vl": True,
    "gemma3": True,
    "pixtral": True,
    "mistral-small3.1": True,
    "minicpm-v": True,
    "moondream": True,
}


def takes_images(model: str, *, default: bool) -> bool:
    """Whether ``model`` takes images, by the table ``IMAGE_INPUT``, else ``default``.

    >>> takes_images("gpt-4o-mini-2024-07-18", default=False)
    True
    >>> takes_images("llama3.1:8b", default=False)
    False
    """
    found = _best_match(model, IMAGE_INPUT)
    return default if found is None else bool(found)
