"""``examples/workspace_notes.py`` runs as written (docs/workspaces.md points to it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "workspace_notes.py"


def test_the_workspace_example_keeps_its_note_across_submissions(tmp_path: Path) -> None:
    """Run twice in one folder, as a reader trying it again would: the second run failed
    ("scripted model 'scribe' has no response #6"), its conversation the first run's."""
    for run in (1, 2):
        out = subprocess.run(
            [sys.executable, str(EXAMPLE)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert out.count("outcome='completed'") == 2
        assert "word_count: 5" in out
        assert "PathOutsideWorkspace" in out
        if shutil.which("bwrap"):
            assert "BUY MILK AND CALL ADA." in out
        notes = sorted((tmp_path / "notes-workspaces" / "scribe").glob("me-*/notes/monday.md"))
        assert len(notes) == run
        assert {note.read_text() for note in notes} == {"Buy milk and call Ada."}
