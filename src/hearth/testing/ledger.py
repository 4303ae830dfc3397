"""A stand-in for an external system with idempotency keys, for tests of reconciled outcomes.

``Ledger(path)`` keeps one entry per key in a directory, written *insert-if-absent* atomically
(the value goes to a temporary file that is then hard-linked to the key's name, which fails when
the name exists), so two processes recording the same key — a re-run and a zombie's late request —
leave exactly one effect. Every request, accepted or refused, is also appended to a log.

Example (a tool and its reconcile, keyed by the tool call id)::

    payments = Ledger(os.environ["LEDGER_DIR"])

    def paid(call: hearth.ReconcileCall) -> hearth.Done | hearth.NotDone:
        entry = payments.get(call.tool_call_id)
        return hearth.NotDone() if entry is None else hearth.Done(entry)

    @hearth.tool(reconcile=paid)
    def pay(amount: int, ctx: hearth.ToolContext) -> dict:
        payments.record(ctx.tool_call_id, {"paid": amount})
        return payments.get(ctx.tool_call_id)

Kill points (``HEARTH_CRASH_AT``): ``ledger:record`` just before an entry is written,
``ledger-done:record`` just after it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from hearth import _faults

TOMBSTONE = {"tombstone": True}  # the value ``tombstone`` writes: the key may never take effect


class Ledger:
    """Effects keyed by idempotency key, recorded at most once per key, across processes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.log = self.path / "requests.log"

    def _entry(self, key: str) -> Path:
        return self.path / f"{hashlib.sha256(key.encode()).hexdigest()}.json"

    def record(self, key: str, value: Any = None) -> bool:
        """Record the effect of ``key`` unless one is recorded (or a tombstone): True when this
        request took effect. Atomic: of concurrent requests for one key, exactly one wins."""
        _faults.reached("ledger:record")
        body = json.dumps({"key": key, "value": value})
        fd, tmp = tempfile.mkstemp(dir=self.path, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, self._entry(key))
                took = True
            except FileExistsError:
                took = False
        finally:
            os.unlink(tmp)
        with open(self.log, "a") as f:
            f.write(f"{key}|{'accepted' if took else 'refused'}|{os.getpid()}\n")
        if took:
            _faults.reached("ledger-done:record")
        return took

    def tombstone(self, key: str) -> bool:
        """Make sure ``key`` never takes effect from now on: True when no effect was recorded
        (a tombstone is then in its place, and a late request for it is refused)."""
        return self.record(key, TOMBSTONE) or self.get(key) == TOMBSTONE

    def get(self, key: str) -> Any:
        """The value recorded for ``key`` (``TOMBSTONE`` for a tombstone), or None."""
        try:
            text = self._entry(key).read_text()
        except FileNotFoundError:
            return None
        return json.loads(text)["value"]

    def entries(self) -> dict[str, Any]:
        """Every recorded key and its value."""
        found = {}
        for p in self.path.glob("*.json"):
            data = json.loads(p.read_text())
            found[data["key"]] = data["value"]
        return found

    def requests(self, key: str | None = None) -> list[tuple[str, bool, int]]:
        """Every request so far, in order: ``(key, accepted, pid)``."""
        text = self.log.read_text() if self.log.exists() else ""
        rows = [line.split("|") for line in text.splitlines() if line]
        return [(k, took == "accepted", int(pid)) for k, took, pid in rows if key in (None, k)]


__all__ = ["TOMBSTONE", "Ledger"]
