"""hearth: durable AI agents for Python.

Every input to an agent is admitted durably as a submission and reaches exactly one terminal
outcome (completed, failed or aborted), through crashes, restarts and redeploys.
"""

from hearth import channels
from hearth._version import __version__
from hearth.agent import Agent, AgentContext, Durability, agent
from hearth.app import App
from hearth.attachments import Attachment
from hearth.channels import Channel, Delivery, Dispatch
from hearth.client import AsyncClient, Client
from hearth.effects import Done, NotDone, ReconcileCall
from hearth.errors import (
    AttachmentNotFound,
    AttachmentTooLarge,
    ChannelFailed,
    ConfigurationError,
    ConversationExists,
    ConversationNotFound,
    DelegatedConversation,
    DeliveryNotFound,
    FencedOut,
    HearthError,
    IdempotencyConflict,
    IntegrityError,
    InvalidId,
    InvalidInput,
    InvalidSignature,
    NotARestPoint,
    PathOutsideWorkspace,
    ProviderError,
    ReadOfOwnConversation,
    SandboxUnavailable,
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
    WorkspaceError,
)
from hearth.receipts import AbortResult, Receipt, Reply
from hearth.runtime.hooks import AgentFinish, AgentStart
from hearth.runtime.runtime import Runtime
from hearth.schedules import Schedule
from hearth.steps import Steps
from hearth.tools import Tool, ToolContext, tool
from hearth.workspaces import (
    EphemeralWorkspace,
    LocalWorkspace,
    OpenWorkspace,
    RunLimits,
    RunResult,
    Workspace,
)

__all__ = [
    "AbortResult",
    "Agent",
    "AgentContext",
    "AgentFinish",
    "AgentStart",
    "App",
    "AsyncClient",
    "Attachment",
    "AttachmentNotFound",
    "AttachmentTooLarge",
    "Channel",
    "ChannelFailed",
    "Client",
    "ConfigurationError",
    "ConversationExists",
    "ConversationNotFound",
    "DelegatedConversation",
    "Delivery",
    "DeliveryNotFound",
    "Dispatch",
    "Done",
    "Durability",
    "EphemeralWorkspace",
    "FencedOut",
    "HearthError",
    "IdempotencyConflict",
    "IntegrityError",
    "InvalidId",
    "InvalidInput",
    "InvalidSignature",
    "LocalWorkspace",
    "NotARestPoint",
    "NotDone",
    "OpenWorkspace",
    "PathOutsideWorkspace",
    "ProviderError",
    "ReadOfOwnConversation",
    "Receipt",
    "ReconcileCall",
    "Reply",
    "RunLimits",
    "RunResult",
    "Runtime",
    "SandboxUnavailable",
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
    "Workspace",
    "WorkspaceError",
    "__version__",
    "agent",
    "channels",
    "tool",
]
