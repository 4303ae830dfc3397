"""What a soak reached, read back from its databases: the outcomes (with the error type of a
failure) and the recovery situations that the records show happened."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from hearth.records import (
    AssistantMessageCompleted,
    ChildConversationLinked,
    Compaction,
    HookSeamCommitted,
    Record,
    Signal,
    StateWrite,
    ToolOutcome,
    ToolStepSettled,
)
from hearth.store.base import JOINED, Store, Submission, all_submissions
from hearth.testing.invariants import read_streams

# Every soak of at least a couple of hundred kills must reach each of these.
OUTCOMES_REQUIRED = (
    "completed",
    "failed:retry_exhausted",
    "failed:provider_error",
    "failed:timeout",
    "aborted",
)


async def reached(store: Store) -> tuple[list[Submission], dict[str, list[Record]]]:
    subs = await all_submissions(store)
    return subs, await read_streams(store, subs)


def situations(
    rows: Sequence[Submission], streams: Mapping[str, list[Record]]
) -> list[tuple[str, int]]:
    """How often each recovery situation (SPEC §6) and each feature shows in the records."""
    seen: Counter[str] = Counter()
    for sub in rows:
        if sub.status == JOINED:
            seen["joined"] += 1
        if sub.outcome is not None and sub.attempt > 1:
            seen[f"settled after a retry ({sub.outcome})"] += 1
    for records in streams.values():
        for r in records:
            if isinstance(r, Signal):
                seen[f"signal {r.signal_type}"] += 1
            elif isinstance(r, AssistantMessageCompleted) and r.stop_reason in ("aborted", "error"):
                kind = (r.error or {}).get("kind", "")
                seen[f"turn ended {r.stop_reason}{' ' + str(kind) if kind else ''}"] += 1
            elif isinstance(r, ToolOutcome) and r.is_error and isinstance(r.content, dict):
                seen[f"tool outcome {r.content.get('type')}"] += 1
            elif isinstance(r, Compaction):
                seen["compaction"] += 1
            elif isinstance(r, HookSeamCommitted):
                seen[f"hook seam {r.hook}"] += 1
            elif isinstance(r, ToolStepSettled):
                seen["durable step recorded"] += 1
            elif isinstance(r, ChildConversationLinked):
                seen["subagent task"] += 1
            elif isinstance(r, StateWrite):
                seen[f"state write {r.name}"] += 1
    return sorted(seen.items())
