"""What every attempt needs from the runtime around it."""

from __future__ import annotations

from dataclasses import dataclass, field

from hearth.agent import Agent
from hearth.providers.registry import ProviderRegistry
from hearth.runtime.metrics import Metrics
from hearth.store.base import Store


@dataclass
class Env:
    """What every attempt needs from the runtime around it: the store, the declared agents, the
    model providers and the metrics they report to."""

    store: Store
    agents: dict[str, Agent]
    providers: ProviderRegistry
    metrics: Metrics = field(default_factory=Metrics)
