"""hearth: durable AI agents for Python.

Every input to an agent is admitted durably as a submission and reaches exactly one terminal
outcome (completed, failed or aborted), through crashes, restarts and redeploys.
"""

from hearth import channels
from hearth._version import __version__
from hearth.agent import Agent, AgentContext, Durability, agent
from hearth.app import App
from hearth.channels import Channel, Delivery, Dispatch
from hearth.client import AsyncClient, Client
from hearth.effects import Done, NotDone, ReconcileCall
from hearth.errors import (
    ChannelFailed,
    ConfigurationError,
    ConversationNotFound,
    DeliveryNotFound,
    FencedOut,
    HearthError,
    IdempotencyConflict,
    IntegrityError,
    InvalidId,
    InvalidInput,
    InvalidSignature,
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
    UnknownChannel,
    WaitConflict,
    WaitNotFound,
    WaitTimedOut,
)
from hearth.receipts import AbortResult, Receipt, Reply
from hearth.runtime.hooks import AgentFinish, AgentStart
from hearth.runtime.runtime import Runtime
from hearth.schedules import Schedule
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
    "Channel",
    "ChannelFailed",
    "Client",
    "ConfigurationError",
    "ConversationNotFound",
    "Delivery",
    "DeliveryNotFound",
    "Dispatch",
    "Done",
    "Durability",
    "FencedOut",
    "HearthError",
    "IdempotencyConflict",
    "IntegrityError",
    "InvalidId",
    "InvalidInput",
    "InvalidSignature",
    "NotDone",
    "ProviderError",
    "Receipt",
    "ReconcileCall",
    "Reply",
    "Runtime",
    "Schedule",
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
    "UnknownChannel",
    "WaitConflict",
    "WaitNotFound",
    "WaitTimedOut",
    "__version__",
    "agent",
    "channels",
    "tool",
]
