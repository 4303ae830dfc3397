"""A model provider's stream as the runtime reads it: what the provider's own code raises is a
provider error like any other, never a crash of the attempt."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator

from hearth.errors import APP_CODE_ERRORS, ProviderError
from hearth.providers.base import ModelEvent, ModelProvider, ModelRequest

log = logging.getLogger("hearth")


async def provider_events(
    provider: ModelProvider, request: ModelRequest
) -> AsyncGenerator[ModelEvent, None]:
    """``provider.stream(request)``, with what the provider's own code raises, other than a
    ``ProviderError``, turned into a transient one (recorded, retried under the durable budget,
    and named in the submission's error when that runs out). A provider of the application's
    may have a bug; it is not the runtime's, and no attempt should crash on it. So is a
    ``CancelledError`` that nothing cancelled (a leaked one)."""
    try:
        async with contextlib.aclosing(provider.stream(request)) as events:
            async for event in events:
                yield event
    except ProviderError:
        raise
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise
        raise _raised(provider, "CancelledError (nothing cancelled it)") from None
    except APP_CODE_ERRORS as exc:
        log.warning("model provider %r raised", provider.name, exc_info=exc)
        raise _raised(provider, f"{type(exc).__name__}: {exc}") from exc


def _raised(provider: ModelProvider, what: str) -> ProviderError:
    return ProviderError(f"{provider.name}: the provider raised {what}"[:2000], kind="transient")
