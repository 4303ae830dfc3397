"""hearth: durable AI agents for Python.

Every input to an agent is admitted durably as a submission and reaches exactly one terminal
outcome (completed, failed or aborted), through crashes, restarts and redeploys.
"""

from hearth._version import __version__
from hearth.agent import Agent, AgentContext, Durability, agent
from hearth.app import App
from hearth.client import AsyncClient, Client
from hearth.errors import (
    ConfigurationError,
    ConversationNotFound,
    FencedOut,
    HearthError,
    IdempotencyConflict,
    IntegrityError,
    InvalidId,
    InvalidInput,
    ProviderError,
    SchemaTooNew,
    ShuttingDown,
    StateWriteDuringRender,
    StepError,
    StoreError,
    SubmissionAborted,
    SubmissionError,
    SubmissionFailed,
    SubmissionNotFound,
    UnknownAgent,
    WaitConflict,
    WaitNotFound,
    WaitTimedOut,
)
from hearth.receipts import AbortResult, Receipt, Reply
from hearth.runtime.hooks import AgentFinish, AgentStart
from hearth.runtime.runtime import Runtime
from hearth.steps import Steps
from hearth.tools import Tool, ToolContext, tool

__all__ = [
    "AbortResult",
    "Agent",
    "AgentContext",
    "AgentFinish",
    "AgentStart",
    "App",
    "AsyncClient",
    "Client",
    "ConfigurationError",
    "ConversationNotFound",
    "Durability",
    "FencedOut",
    "HearthError",
    "IdempotencyConflict",
    "IntegrityError",
    "InvalidId",
    "InvalidInput",
    "ProviderError",
    "Receipt",
    "Reply",
    "Runtime",
    "SchemaTooNew",
    "ShuttingDown",
    "StateWriteDuringRender",
    "StepError",
    "Steps",
    "StoreError",
    "SubmissionAborted",
    "SubmissionError",
    "SubmissionFailed",
    "SubmissionNotFound",
    "Tool",
    "ToolContext",
    "UnknownAgent",
    "WaitConflict",
    "WaitNotFound",
    "WaitTimedOut",
    "__version__",
    "agent",
    "tool",
]
