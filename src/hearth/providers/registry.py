"""Resolving ``"provider/model"`` specs to the provider that serves them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hearth.errors import ConfigurationError
from hearth.providers.base import ModelProvider


class ProviderRegistry:
    """Providers given to the ``App`` are asked first, then the built-in ones (made lazily, so
    an app that never talks to OpenAI or Anthropic needs no keys)."""

    def __init__(
        self,
        providers: Sequence[ModelProvider] = (),
        builtins: Callable[[], Sequence[ModelProvider]] | None = None,
    ) -> None:
        for p in providers:
            if not isinstance(p, ModelProvider):
                raise ConfigurationError(f"{p!r} is not a model provider")
        self._given = list(providers)
        self._builtins_factory = builtins
        self._builtins: list[ModelProvider] | None = None

    def _all(self, include_builtins: bool) -> list[ModelProvider]:
        if include_builtins and self._builtins is None:
            self._builtins = list(self._builtins_factory()) if self._builtins_factory else []
        return self._given + (self._builtins or [] if include_builtins else [])

    def resolve(self, spec: str) -> tuple[ModelProvider, str]:
        name, sep, model = spec.partition("/")
        if not sep or not name or not model:
            raise ConfigurationError(f"model spec {spec!r} must look like 'provider/model'")
        for include_builtins in (False, True):
            for provider in self._all(include_builtins):
                if provider.name == name and provider.supports(model):
                    return provider, model
        raise ConfigurationError(
            f"no provider serves {spec!r}; register one with App(..., providers=[...])"
        )

    async def aclose(self) -> None:
        for p in self._given + (self._builtins or []):
            await p.aclose()
