"""Helpers for testing agents: a scripted model and a crash harness.

Example::

    from hearth.testing import ScriptedModel, reply, calls, call

    model = ScriptedModel("demo", [calls(call("lookup_order", order_id="7")), reply("Shipped.")])
    app = hearth.App([support], db="memory", providers=[model])   # support uses "scripted/demo"
"""

from hearth.testing.crash import ChildRun, CrashHarness
from hearth.testing.ledger import Ledger
from hearth.testing.points import KILL_POINT_PATTERNS, KILL_POINTS, STORE_WRITES
from hearth.testing.scripted import (
    CallsStep,
    ErrorStep,
    ScriptedModel,
    ScriptStep,
    ScriptStepFunction,
    StallStep,
    Step,
    StepFunction,
    TextStep,
    ToolCallSpec,
    call,
    calls,
    error,
    overflow,
    reply,
    stall,
    stream,
)

__all__ = [
    "KILL_POINTS",
    "KILL_POINT_PATTERNS",
    "STORE_WRITES",
    "CallsStep",
    "ChildRun",
    "CrashHarness",
    "ErrorStep",
    "Ledger",
    "ScriptStep",
    "ScriptStepFunction",
    "ScriptedModel",
    "StallStep",
    "Step",
    "StepFunction",
    "TextStep",
    "ToolCallSpec",
    "call",
    "calls",
    "error",
    "overflow",
    "reply",
    "stall",
    "stream",
]
