"""The README's examples run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_quickstart_example_runs_and_runs_again(tmp_path: Path) -> None:
    for _ in range(2):  # the second run failed: the scripted model had no second exchange
        out = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "quickstart.py")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert "outcome='completed'" in out.stdout
    assert (tmp_path / "support.db").exists()


def test_the_welcome_example_sends_one_mail() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "welcome.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "state: {'welcome_sent': True}" in out.stdout
    assert out.stdout.count("'event': 'delivered'") == 1


def test_the_subagents_example_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "subagents.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "My researcher reports: What is the capital of Norway? It is Oslo." in out.stdout
    assert "child 0: conversation_created" in out.stdout


def test_the_github_issues_example_admits_each_delivery_once() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "github_issues.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "'delivery_id': 'd-ping', 'submission_ids': [], 'deduplicated': False" in out.stdout
    assert out.stdout.count("'deduplicated': True") == 1
    assert out.stdout.count("submission channel from {'channel': 'github'") == 2
    assert "Noted: ada commented: Same here on 1.2." in out.stdout


def test_the_refund_approval_example_waits_across_a_restart() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "refund_approval.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "small refund: Done: {'refunded': 40, 'order': 'A-7'}" in out.stdout
    assert "status: waiting" in out.stdout
    assert "pending after the restart: ['approval']" in out.stdout
    assert "large refund: Done: {'refunded': 250, 'order': 'A-7'}" in out.stdout
    assert "attempts: 2, of which ended by a wait: 1" in out.stdout
    assert "order loads per conversation: {'support/c-1': 1, 'support/c-2': 1}" in out.stdout


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--hide-error-context", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_examples_type_check_strictly() -> None:
    out = _mypy("--strict", "examples")  # (``ctx.step`` was optional: every step failed)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_docs_complete_examples_type_check(tmp_path: Path) -> None:
    """Every Python block of the README and docs that imports hearth is type-checked as a user's
    mypy would (names the block leaves to the reader, such as ``payments``, are not its fault)."""
    blocks = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found = re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)
        for i, block in enumerate(found):
            if "import hearth" in block:
                path = tmp_path / f"{doc.stem.lower()}_{i}.py"
                path.write_text(block)
                blocks.append(path)
    assert len(blocks) >= 6  # the quickstart among them
    out = _mypy(
        "--config-file",
        "/dev/null",
        "--disable-error-code=name-defined",
        "--disable-error-code=top-level-await",
        *map(str, blocks),
    )
    assert out.returncode == 0, out.stdout + out.stderr
