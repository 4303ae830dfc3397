"""GitHub issue events into one conversation per issue, plus a weekday digest on a schedule.

Serve it behind a GitHub webhook (content type ``application/json``, events "Issues" and
"Issue comments", the same secret in ``$GITHUB_WEBHOOK_SECRET``)::

    GITHUB_WEBHOOK_SECRET=... hearth serve github_issues:app --app-dir examples
    # webhook URL: https://<your host>/channels/github

Every issue gets its own conversation, ``triage/issue-<number>``: its opening, its comments and
its closing arrive there in order. A delivery GitHub sends again (a retry, or "Redeliver" in the
hook's settings) is admitted once. A ``ping`` admits nothing. ``hearth deliveries github`` lists
what arrived; a delivery whose routing raised is kept as failed, to replay after a fix.

Run it as a script (``.venv/bin/python examples/github_issues.py``) to see it work without
GitHub: it signs three deliveries the way GitHub does, sends one of them twice, and prints the
issue's conversation.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import hearth
from hearth.providers.base import ModelRequest, UserTurn
from hearth.testing import ScriptedModel, Step, reply

SECRET = os.environ.setdefault("GITHUB_WEBHOOK_SECRET", "example-secret-change-me")


def _triage_model(request: ModelRequest) -> Step:
    said = [m.content for m in request.messages if isinstance(m, UserTurn)]
    return reply(f"Noted: {said[-1] if said else 'nothing yet'}")


@hearth.agent
def triage(ctx: hearth.AgentContext) -> str:
    # A real app names its model here, e.g. ctx.use_model("openai/gpt-4o-mini").
    ctx.use_model("scripted/triage")
    return "You triage one GitHub issue: label it, ask for what is missing, close duplicates."


def route(delivery: hearth.Delivery) -> list[hearth.Dispatch]:
    """One conversation per issue; other events (ping, push, ...) admit nothing."""
    data: dict[str, Any] = delivery.data
    if delivery.type not in ("issues", "issue_comment") or "issue" not in data:
        return []
    issue = data["issue"]
    if delivery.type == "issue_comment":
        text = f"{data['comment']['user']['login']} commented: {data['comment']['body']}"
    else:
        text = f"Issue #{issue['number']} {data['action']}: {issue['title']}\n\n{issue['body']}"
    return [hearth.Dispatch(triage, f"issue-{issue['number']}", message=text)]


digest = hearth.Schedule(
    "weekday-digest",
    triage,
    "digest",
    cron="0 9 * * 1-5",
    tz="Europe/Paris",
    message="Summarise the issues that changed since yesterday.",
)

app = hearth.App(
    [triage],
    channels=[hearth.Channel("github", verify=hearth.channels.github(), receive=route)],
    schedules=[digest],
    providers=[ScriptedModel("triage", _triage_model)],
)


def signed(event: str, delivery_id: str, payload: dict[str, Any]) -> tuple[dict[str, str], bytes]:
    """Headers and body as GitHub sends them."""
    body = json.dumps(payload).encode()
    return {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery_id,
        "X-Hub-Signature-256": hearth.channels.sign(SECRET, body),
    }, body


async def main() -> None:
    issue = {"number": 42, "title": "Crash on start", "body": "It crashes at boot."}
    comment = {"user": {"login": "ada"}, "body": "Same here on 1.2."}
    deliveries = [
        signed("ping", "d-ping", {"zen": "Keep it logically awesome."}),
        signed("issues", "d-1", {"action": "opened", "issue": issue}),
        signed("issue_comment", "d-2", {"action": "created", "issue": issue, "comment": comment}),
        signed("issue_comment", "d-2", {"action": "created", "issue": issue, "comment": comment}),
    ]
    app.configure(db="memory")  # the script keeps nothing; `hearth serve` uses --db/HEARTH_DB
    async with app.run() as rt:
        for headers, body in deliveries:
            receipt = await rt.deliver("github", headers, body)
            print("delivery", receipt.to_json())
        await rt.settle_all()
        for sub in await rt.submissions("triage/issue-42"):
            print(f"submission {sub.kind} from {sub.source}: {sub.reply}")


if __name__ == "__main__":
    asyncio.run(main())
