"""The ``hearth`` command (also ``python -m hearth``): serve, send, tail, inspect, fork, check,
migrate, demo and more.

Errors are one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import json
import os
import socket
import sys
import time
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import click
import httpx2
from click.core import ParameterSource
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

import hearth
from hearth.client import Client, ServerUnavailable
from hearth.errors import HearthError, ShuttingDown, StoreError, SubmissionError
from hearth.jsontext import strict_json

F = TypeVar("F", bound=Callable[..., Any])
_RELOAD_SPEC = "HEARTH_SERVE_SPEC"  # what --reload's processes serve, as JSON
# Piped output is not cut at 80 columns: lines stay whole for grep and logs.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[red]hearth:[/red] {escape(message)}", soft_wrap=True)
    sys.exit(code)


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def _add_row(table: Table, *cells: str) -> None:
    """A row of literal text: what users wrote (a wait's prompt, a delivery's type, ids) is
    neither rich markup (``[admin]`` would vanish, ``[/]`` raise) nor terminal control
    sequences (an ESC could clear the screen or hide text from the person approving)."""
    table.add_row(*(Text(_visible(str(cell))) for cell in cells))


def _visible(text: str, keep: str = "\t") -> str:
    """``text`` with control and format characters (ESC, CR, bidi overrides) shown escaped,
    but those in ``keep``."""
    return "".join(
        ch if ch in keep or unicodedata.category(ch) not in ("Cc", "Cf") else ascii(ch)[1:-1]
        for ch in text
    )


def friendly(fn: F) -> F:
    """Turn every expected failure into one line and a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            sys.exit(130)
        except BrokenPipeError:
            # The reader went away (`hearth tail | head`): end quietly, as Unix tools do (and as
            # rich does when its own write fails), and keep Python from failing again as it
            # flushes stdout on the way out.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except SubmissionError as exc:
            fail(f"the submission settled {_outcome(exc)}: {exc.error.get('message') or exc.type}")
        except httpx2.ConnectError:
            url = kwargs.get("url") or "the server"
            fail(f"cannot reach {url}: is `hearth serve` running there? (--url, HEARTH_URL)")
        except httpx2.TransportError as exc:
            fail(f"the connection to the server failed: {exc or type(exc).__name__}")
        except httpx2.InvalidURL as exc:
            fail(f"the server's URL is not usable: {exc} (--url, HEARTH_URL)")
        except UnicodeEncodeError as exc:
            # An argument no UTF-8 can carry: bytes the terminal did not decode, say.
            fail(f"an argument has text that is not UTF-8, so it cannot be sent ({exc.reason})")
        except hearth.errors.InvalidInput as exc:
            token = exc.field == "token"  # (the client's own refusal: say where it came from)
            fail(f"{exc} (--token, HEARTH_TOKEN)" if token else str(exc))
        except HearthError as exc:
            fail(str(exc) or type(exc).__name__)
        except TimeoutError as exc:
            fail(str(exc) or "timed out")
        except OSError as exc:
            fail(str(exc))

    return wrapper  # type: ignore[return-value]


def _outcome(exc: SubmissionError) -> str:
    return "aborted" if isinstance(exc, hearth.SubmissionAborted) else "failed"


def default_url() -> str:
    if os.environ.get("HEARTH_URL"):
        return os.environ["HEARTH_URL"]
    host = os.environ.get("HEARTH_HOST") or "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address, as a URL writes it
    return f"http://{host}:{os.environ.get('HEARTH_PORT') or 8000}"


url_option = click.option(
    "--url",
    default=default_url,
    show_default="HEARTH_URL, or http://127.0.0.1:8000",
    help="The server's base URL.",
)
app_dir_option = click.option(
    "--app-dir",
    default=".",
    show_default=True,
    type=click.Path(exists=True, file_okay=False),
    help="Where to import MODULE from.",
)
token_option = click.option(
    "--token", envvar="HEARTH_TOKEN", default=None, help="Bearer token (HEARTH_TOKEN)."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(hearth.__version__, prog_name="hearth")
def main() -> None:
    """hearth: durable AI agents. Start with `hearth demo`."""
    for stream in (sys.stdout, sys.stderr):
        # A terminal or pipe that is not UTF-8 gets what it cannot show escaped: a record's
        # text failed to print there, and the command stopped.
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")


# --- serve -----------------------------------------------------------------------------------
@main.command()
@click.argument("app_ref", metavar="MODULE:APP")
@click.option("--db", help="Database URL (HEARTH_DB); default ./hearth.db.")
@click.option("--host", help="Interface to bind (HEARTH_HOST); default 127.0.0.1.")
@click.option("--port", type=int, help="Port (HEARTH_PORT); default 8000, 0 for any free one.")
@click.option(
    "--token", help="Require this bearer token on every route but /healthz (HEARTH_TOKEN)."
)
@click.option("--workers", type=int, help="Submissions run at once (HEARTH_WORKERS).")
@click.option("--lease-s", type=float, help="Lease length in seconds (HEARTH_LEASE_S).")
@click.option("--heartbeat-s", type=float, help="Lease renewal period (HEARTH_HEARTBEAT_S).")
@click.option("--scan-s", type=float, help="Expired-lease scan period (HEARTH_SCAN_S).")
@click.option("--max-body", type=int, help="Largest request body in bytes (HEARTH_MAX_BODY).")
@click.option(
    "--max-attachment", type=int, help="Largest attached file in bytes (HEARTH_MAX_ATTACHMENT)."
)
@click.option(
    "--max-upload", type=int, help="Largest request with files in bytes (HEARTH_MAX_UPLOAD)."
)
@click.option("--shutdown-s", type=float, help="Longest graceful exit (HEARTH_SHUTDOWN_S).")
@click.option("--pg-pool", type=int, help="PostgreSQL connections per process (HEARTH_PG_POOL).")
@click.option("--max-streams", type=int, help="Open SSE streams per process (HEARTH_MAX_STREAMS).")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="Log lines as text or one JSON object each (HEARTH_LOG_FORMAT).",
)
@click.option("--reload", is_flag=True, help="Restart when code changes (development).")
@app_dir_option
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="warning",
    show_default=True,
    help="The level of hearth's log lines and the server's.",
)
@click.option("--access-log", is_flag=True, help="Log every request.")
@click.option(
    "--strict",
    is_flag=True,
    help="Refuse to start when this code would withdraw a durable contract (see hearth check).",
)
@friendly
def serve(
    app_ref: str,
    reload: bool,
    app_dir: str,
    log_level: str,
    access_log: bool,
    strict: bool,
    **options: Any,
) -> None:
    """Serve MODULE:APP (a hearth.App) over HTTP.

    Runs until SIGTERM or Ctrl-C, then shuts down gracefully within HEARTH_SHUTDOWN_S.
    """
    from hearth.server.serve import serve as run_server

    app = _load_app(app_ref, app_dir, code=1, options=options)
    app.configure(**options)
    settings = app.settings
    # Before the runtime starts (it would claim work, then the server fail to listen).
    _check_listen(settings.host, settings.port)
    if strict:
        _refuse_withdrawals(app)
    if reload:
        spec = {"app": app_ref, "app_dir": os.path.abspath(app_dir), "options": options}
        _serve_reload(app, {**spec, "log_level": log_level, "access_log": access_log})
        return
    run_server(app, log_level=log_level, access_log=access_log, on_ready=_ready(app))


def _load_app(
    app_ref: str, app_dir: str, *, code: int, options: dict[str, Any] | None = None
) -> hearth.App:
    """``load_app``, its failures one line (exit ``code``): the module's own import error, such
    as a dependency not installed or a variable not set, is named with its type. ``options``:
    those given on the command line, which win over their variables already while the module
    makes its ``App`` (an empty ``HEARTH_TOKEN`` beside ``--token`` refused to start)."""
    from hearth.app import load_app

    try:
        with _options_over_variables(options or {}):
            return load_app(app_ref, app_dir)
    except HearthError as exc:
        fail(str(exc), code)
    except Exception as exc:
        fail(f"cannot import {app_ref}: {type(exc).__name__}: {exc}", code)


@contextlib.contextmanager
def _options_over_variables(options: dict[str, Any]) -> Iterator[None]:
    """While in it, each given option's ``HEARTH_*`` variable holds the option's value."""
    # (an empty one is left for ``configure`` to refuse, naming the option)
    given = {f"HEARTH_{k.upper()}": str(v) for k, v in options.items() if v not in (None, "")}
    before = {name: os.environ.get(name) for name in given}
    os.environ.update(given)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _ready(app: hearth.App) -> Callable[[str], None]:
    """The line ``hearth serve`` prints once the runtime has started and the port is bound."""
    from hearth.config import shown_db

    def ready(url: str) -> None:
        db = shown_db(app.settings.db)
        names = sorted(app.agents)
        line = f"hearth: serving {url} (agents: {', '.join(names)}; db: {db})"
        if app.settings.log_format == "json":  # one JSON object a line, as the log's are
            line = _json_line(line, url=url, agents=names, db=db)
        click.echo(line, nl=True)
        sys.stdout.flush()

    return ready


def _json_line(message: str, **fields: Any) -> str:
    """``message`` as a line of ``--log-format json`` (level info), with ``fields``."""
    import logging

    from hearth.logs import JsonFormatter

    record = logging.LogRecord("hearth.serve", logging.INFO, __file__, 0, message, None, None)
    return json.dumps({**json.loads(JsonFormatter().format(record)), **fields})


def _check_listen(host: str, port: int) -> None:
    """Fail in one line when ``host:port`` cannot be listened on (a port in use, an address not
    of this machine): it was uvicorn's own error line, after the runtime had started."""
    import errno

    # (Port 0 too: any free port is found, but an address not of this machine is not.)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        fail(f"cannot listen on {host}:{port}: {exc} (--host, HEARTH_HOST)")
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                fail(
                    f"port {port} on {host} is in use (another server?); choose another with"
                    " --port (HEARTH_PORT)"
                )
            fail(f"cannot listen on {host}:{port}: {exc.strerror or exc} (--host, HEARTH_HOST)")


def _refuse_withdrawals(app: hearth.App) -> None:
    """``serve --strict``: the redeploy check's findings stop the server before it starts."""
    from hearth.app import open_database
    from hearth.redeploy import Report, check_store

    async def run() -> Report:
        store = await open_database(app.settings.db, pg_pool=1)  # the server opens it next
        try:
            return await check_store(store, app.agents)
        finally:
            await store.close()

    report = asyncio.run(run())
    if report.withdrawn:
        for line in report.lines():
            err.print(escape(line), soft_wrap=True)
        fail("--strict: this code would withdraw durable contracts of accepted work (above)")


def _serve_reload(app: hearth.App, spec: dict[str, Any]) -> None:
    """``serve --reload``: this process binds the socket and watches the files; each process
    it starts (again after every change) serves the app as ``hearth serve`` does, with the
    same settings, log format, access log, token redaction and graceful shutdown."""
    import uvicorn
    from uvicorn.supervisors import ChangeReload

    from hearth import logs

    settings = app.settings
    log_config = logs.configure(settings.log_format, spec["log_level"])
    extra: dict[str, Any] = {} if log_config is None else {"log_config": log_config}
    # Only the watching is configured here: _serve_reloaded builds each process's server.
    config = uvicorn.Config(
        spec["app"],
        reload=True,
        reload_dirs=[spec["app_dir"]],
        host=settings.host,
        port=settings.port,
        log_level=spec["log_level"],
        **extra,
    )
    logs.redact(settings.token)  # uvicorn's handlers exist now (made by Config)
    sock = config.bind_socket()
    os.environ[_RELOAD_SPEC] = json.dumps(spec)
    watching = f"hearth: restarting the server when files under {spec['app_dir']} change"
    if settings.log_format == "json":
        watching = _json_line(watching, app_dir=spec["app_dir"])
    click.echo(watching)
    ChangeReload(config, target=_serve_reloaded, sockets=[sock]).run()


def _serve_reloaded(sockets: list[socket.socket] | None) -> None:
    """What each process of ``hearth serve --reload`` runs, on the socket its parent bound."""
    from hearth.server.serve import serve as run_server

    spec = json.loads(os.environ[_RELOAD_SPEC])
    # A change that broke the app (a syntax error too) is one line; the next change restarts it.
    app = _load_app(spec["app"], spec["app_dir"], code=1, options=spec["options"])
    try:
        app.configure(**spec["options"])
    except HearthError as exc:
        fail(str(exc))
    run_server(
        app,
        log_level=spec["log_level"],
        access_log=spec["access_log"],
        on_ready=_ready(app),
        sockets=sockets,
    )


# --- send ------------------------------------------------------------------------------------
@main.command()
@click.argument("agent")
@click.argument("id")
@click.argument("message")
@url_option
@token_option
@click.option("--wait", is_flag=True, help="Wait for the reply and print it.")
@click.option(
    "--timeout",
    type=float,
    default=None,
    help="With --wait: give up after this many seconds (inf: never, the default).",
)
@click.option("--idempotency-key", default=None, help="Admit at most once per key.")
@click.option(
    "--attach",
    "attach",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, readable=True),
    help="Send this file with the message (repeatable).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@friendly
def send(
    agent: str,
    id: str,
    message: str,
    url: str,
    token: str | None,
    wait: bool,
    timeout: float | None,
    idempotency_key: str | None,
    attach: tuple[str, ...],
    as_json: bool,
) -> None:
    """Send MESSAGE to conversation AGENT/ID (with --attach FILE, files too)."""
    if timeout is not None and not timeout >= 0:  # (NaN too) before anything is admitted
        fail(f"--timeout must be 0 or more seconds, not {timeout}", 2)
    files = [hearth.Attachment.from_path(path) for path in attach]
    began = time.monotonic()
    # With --wait, --timeout bounds the whole command, the admission too (it waited 30 s for a
    # server that had stopped answering), which gets at least a second.
    limit = 30.0 if timeout is None or not wait else min(30.0, max(timeout, 1.0))
    with Client(url, token, timeout=limit) as client:
        conv = client.conversation(agent, id)
        try:
            receipt = conv.send(message, idempotency_key=idempotency_key, attachments=files)
        except httpx2.TransportError as exc:
            if isinstance(exc, _NEVER_SENT):
                raise  # (the request never reached the server)
            if idempotency_key:
                again = (
                    f"send it again with the same --idempotency-key {idempotency_key}: it is"
                    " admitted once"
                )
            else:
                again = f"look (hearth tail {agent} {id}) before sending it again"
            if isinstance(exc, httpx2.TimeoutException):
                lost = f"the server did not answer the admission within {limit:g} s"
            else:  # (the connection broke once the request was sent: the answer is lost)
                why = str(exc) or type(exc).__name__
                lost = f"the connection broke before the server answered ({why})"
            fail(f"{lost}: the message may have been admitted all the same; {again}")
        if not wait:
            if as_json:
                click.echo(json.dumps(receipt.to_json()))
            else:
                again = " (deduplicated: admitted before)" if receipt.deduplicated else ""
                click.echo(f"{receipt.submission_id} admitted to {conv.conversation_id}{again}")
            return
        with err.status(f"waiting for {receipt.submission_id} to settle…"):
            try:
                left = None if timeout is None else max(0.0, timeout - (time.monotonic() - began))
                reply = conv.read(receipt, timeout=left)
            except SubmissionError as exc:
                if not as_json:
                    raise
                # A script asked for JSON: it gets the outcome there too (and the exit status).
                outcome = {"outcome": _outcome(exc), "error": exc.error}
                click.echo(json.dumps({"submission_id": receipt.submission_id, **outcome}))
                sys.exit(1)
        if as_json:
            answer = {"submission_id": reply.submission_id, "outcome": "completed"}
            click.echo(json.dumps({**answer, "reply": reply.text}))
        elif sys.stdout.isatty():
            # What a model wrote (or echoed) must not drive the terminal, as in `hearth tail`;
            # a pipe gets the reply as it is.
            click.echo(_visible(reply.text, keep="\t\n"))
        else:
            click.echo(reply.text)


# Transport errors raised before a request reaches the server: nothing can have been admitted.
_NEVER_SENT = (
    httpx2.ConnectError,
    httpx2.LocalProtocolError,
    httpx2.ProxyError,
    httpx2.UnsupportedProtocol,
)


# --- tail ------------------------------------------------------------------------------------
@main.command()
@click.argument("agent")
@click.argument("id")
@click.option(
    "--offset",
    type=click.IntRange(-1, 2**62),  # (what the server takes: hearth.server.tail.MAX_OFFSET)
    default=-1,
    show_default=True,
    help="Show records after it.",
)
@url_option
@token_option
@click.option("--follow/--no-follow", default=True, help="Keep following live (default).")
@click.option("--json", "as_json", is_flag=True, help="Print each record as one JSON line.")
@friendly
def tail(
    agent: str, id: str, offset: int, url: str, token: str | None, follow: bool, as_json: bool
) -> None:
    """Print a conversation's stream and follow it live.

    One line per record of AGENT/ID; reconnects by itself when the server restarts.
    """
    with Client(url, token) as client:
        conv = client.conversation(agent, id)
        if follow:
            # A server nobody reaches is one line, as for the other commands: the stream
            # reconnects (for ever) only to one that answers. One that answers 503 (its
            # database away, a restart draining it) is waited for, as the stream would.
            with contextlib.suppress(ServerUnavailable, ShuttingDown):
                client.health()
        records = conv.stream(offset) if follow else iter(conv.history(offset))
        for record in records:
            if as_json:
                click.echo(json.dumps(record, ensure_ascii=False))
            else:
                out.print(describe(record), soft_wrap=True)
            sys.stdout.flush()


# --- inspect ---------------------------------------------------------------------------------
@main.command()
@url_option
@token_option
@click.option("--conversation", default=None, help="Only this AGENT/ID.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@friendly
def inspect(url: str, token: str | None, conversation: str | None, as_json: bool) -> None:
    """Submissions by status, the leases held, and stuck work."""
    with Client(url, token) as client:
        data = client.admin_submissions(conversation)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    counts = Table(title="submissions", title_justify="left")
    counts.add_column("status")
    counts.add_column("count", justify="right")
    for status in ("queued", "running", "waiting", "settled", "joined"):
        _add_row(counts, status, str(data["counts"].get(status, 0)))
    for outcome, n in sorted(data["outcomes"].items()):
        _add_row(counts, f"  {outcome}", str(n))
    out.print(counts)
    if data["unsettled"]:
        table = Table(title="unsettled", title_justify="left")
        for col in ("submission", "conversation", "kind", "source", "status", "attempt", "owner"):
            table.add_column(col)
        for sub in data["unsettled"]:
            _add_row(
                table,
                sub["id"],
                sub["conversation_id"],
                sub.get("kind", ""),
                source_text(sub.get("source")),
                sub["status"],
                _attempts(sub),
                sub["lease_owner"] or "",
            )
        out.print(table)
    sourced = [sub for sub in data.get("recent", []) if sub.get("source")]
    if sourced:  # inputs from channels and schedules, with where they came from
        table = Table(title="recent from channels and schedules", title_justify="left")
        for col in ("submission", "conversation", "kind", "source", "outcome"):
            table.add_column(col)
        for sub in sourced:
            _add_row(
                table,
                sub["id"],
                sub["conversation_id"],
                sub["kind"],
                source_text(sub["source"]),
                sub["outcome"] or "",
            )
        out.print(table)
    for lease in data["leases"]:
        out.print(
            f"lease {lease['submission_id']} ({lease['conversation_id']}) held by"
            f" {escape(_visible(str(lease['owner'])))}, expires in {lease['expires_in_s']:.1f} s"
        )
    if data["stuck"]:
        for item in data["stuck"]:
            out.print(
                f"[yellow]stuck[/yellow] {item['submission_id']} ({item['conversation_id']}):"
                f" {escape(_visible(item['reason']))}"
            )
    else:
        out.print("no stuck work")


def source_text(source: dict[str, Any] | None) -> str:
    """Where a submission came from, in a few words: ``channel github #d-1``,
    ``schedule daily @2026-12-04T09:00:00Z``, or nothing for a direct one."""
    if not source:
        return ""
    if "channel" in source:
        return f"channel {source['channel']} #{source.get('delivery_id')}"
    if "schedule" in source:
        return f"schedule {source['schedule']} @{source.get('occurrence')}"
    return json.dumps(source)


# --- schedules and deliveries ------------------------------------------------------------------
@main.command()
@url_option
@token_option
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@friendly
def schedules(url: str, token: str | None, as_json: bool) -> None:
    """The app's schedules, with their last and next occurrence (UTC)."""
    with Client(url, token) as client:
        data = client.schedules()
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    if not data["schedules"]:
        out.print("no schedules")
        return
    table = Table(title="schedules", title_justify="left")
    for col in ("name", "conversation", "cron", "tz", "last occurrence", "next occurrence"):
        table.add_column(col)
    for s in data["schedules"]:
        _add_row(
            table,
            s["name"],
            f"{s['agent']}/{s['id']}",
            s["cron"],
            s["tz"],
            s["last_occurrence"] or "-",
            s["next_occurrence"] or "-",
        )
    out.print(table)


@main.command()
@click.argument("channel")
@url_option
@token_option
@click.option("--status", type=click.Choice(["admitted", "failed"]), default=None)
@click.option("--replay", "replay_id", default=None, help="Route this failed delivery again.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@friendly
def deliveries(
    channel: str,
    url: str,
    token: str | None,
    status: str | None,
    replay_id: str | None,
    as_json: bool,
) -> None:
    """A channel's deliveries (newest first), or --replay a failed one."""
    with Client(url, token) as client:
        if replay_id is not None:
            done = client.replay(channel, replay_id)
            if as_json:
                click.echo(json.dumps(done))
            else:
                ids = ", ".join(done["submission_ids"]) or "nothing"
                again = " (already admitted)" if done["deduplicated"] else ""
                click.echo(f"delivery {done['delivery_id']} admitted {ids}{again}")
            return
        data = client.deliveries(channel, status)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    table = Table(title=f"deliveries of {channel}", title_justify="left")
    for col in ("delivery", "type", "status", "attempts", "submissions", "error"):
        table.add_column(col)
    for d in data["deliveries"]:
        error = d["error"] or {}
        _add_row(
            table,
            d["delivery_id"],
            d["type"],
            d["status"],
            str(d["attempts"]),
            ", ".join(d["submission_ids"]),
            f"{error.get('type')}: {_short(error.get('message') or '', 60)}" if error else "",
        )
    out.print(table)


# --- fork ------------------------------------------------------------------------------------
@main.command()
@click.argument("agent")
@click.argument("id")
@click.argument("offset", type=int)
@click.argument("new_id")
@url_option
@token_option
@friendly
def fork(agent: str, id: str, offset: int, new_id: str, url: str, token: str | None) -> None:
    """Fork AGENT/ID at the rest point OFFSET into a new conversation AGENT/NEW_ID.

    The fork holds the records up to OFFSET and the state as of then; the source is not touched.
    A rest point is the offset of a `submission_settled` record with no submission open at it,
    or 0. For example, replay a failed conversation against fixed code:
    `hearth fork support c-1 14 c-1-retry && hearth send support c-1-retry "try again" --wait`.
    """
    with Client(url, token) as client:
        client.conversation(agent, id).fork(offset, new_id)
    click.echo(f"forked {agent}/{id} at offset {offset} into {agent}/{new_id}")


# --- resolve and waits -----------------------------------------------------------------------
def db_option(verb: str) -> Callable[[F], F]:
    return click.option(
        "--db",
        default=None,
        help=f"{verb} this database directly (a SQLite file no process holds, or PostgreSQL)"
        " instead of asking a server.",
    )


# A VALUE such as -1 or -0.5 is a value, not an option that does not exist.
@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("agent")
@click.argument("id")
@click.argument("wait_id")
@click.argument("value")
@url_option
@token_option
@db_option("Write to")
@friendly
def resolve(
    agent: str, id: str, wait_id: str, value: str, url: str, token: str | None, db: str | None
) -> None:
    """Resolve the durable wait WAIT_ID of AGENT/ID with VALUE, a JSON text.

    For example `hearth resolve support c-1 w_3f… true` or `… '{"approved": false}'`. The same
    value twice is fine; another one is refused. With --db the database is written directly, so
    no server needs to run: the next one to start continues the work.
    """
    try:
        parsed = strict_json(value)  # NaN and Infinity too: no reader could take them back
    except (ValueError, RecursionError):
        fail(
            f"VALUE must be JSON, such as true, 42, '\"text\"' or '{{\"ok\": true}}'; got {value!r}"
        )
    parsed = _resolution(parsed)  # checked here as the runtime checks it, whichever way it goes
    if db is not None:
        wait = asyncio.run(_resolve_in(db, agent, id, wait_id, parsed))
        submission_id = wait.submission_id
    else:
        with Client(url, token) as client:
            answer = client.conversation(agent, id).resolve(wait_id, parsed)
        submission_id = answer["submission_id"]
    # (the submission's own conversation: a delegated task's wait is its parent's submission's)
    click.echo(
        f"{wait_id} resolved; submission {submission_id} runs again once no wait of it is pending"
    )


def _resolution(value: Any) -> Any:
    from hearth.runtime.waits import resolution

    return resolution(value)


async def _resolve_in(db: str, agent: str, id: str, wait_id: str, value: Any) -> Any:
    from hearth.app import open_database
    from hearth.receipts import check_id

    store = await open_database(db, pg_pool=1, existing=True)
    try:
        return await store.resolve_wait(f"{agent}/{check_id(id)}", wait_id, value)
    finally:
        await store.close()


@main.command()
@url_option
@token_option
@db_option("Read")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@friendly
def waits(url: str, token: str | None, db: str | None, as_json: bool) -> None:
    """List the pending durable waits, oldest first."""
    if db is not None:
        pending = [w.to_json() for w in asyncio.run(_waits_in(db))]
    else:
        with Client(url, token) as client:
            pending = client.waits()
    if as_json:
        click.echo(json.dumps({"waits": pending}, indent=2, ensure_ascii=False))
        return
    if not pending:
        out.print("no pending waits")
        return
    table = Table(title="pending waits", title_justify="left")
    for col in ("wait", "conversation", "name", "prompt", "expires"):
        table.add_column(col)
    for w in pending:
        _add_row(
            table,
            w["wait_id"],
            w["conversation_id"],
            w["name"],
            _short(w["prompt"], 60),
            w["expires_at"] or "never",
        )
    out.print(table)


async def _waits_in(db: str) -> list[Any]:
    from hearth.app import open_database
    from hearth.store.base import LIST_LIMIT

    store = await open_database(db, pg_pool=1, existing=True)
    try:
        found: list[Any] = []
        while True:
            page = await store.list_waits(after=found[-1].seq if found else 0)
            found += page
            if len(page) < LIST_LIMIT:
                return found
    finally:
        await store.close()


# --- check -----------------------------------------------------------------------------------
@main.command()
@click.argument("app_ref", metavar="MODULE:APP")
@click.option("--db", default=None, help="Database URL; default the app's (HEARTH_DB).")
@app_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def check(app_ref: str, db: str | None, app_dir: str, as_json: bool) -> None:
    """Before a deploy: what recovery would do to unsettled work under MODULE:APP.

    Reads the records of every queued, running and waiting submission (it never claims, writes
    or runs anything) and prints one line per submission whose durable contract the new code
    would change: durable tools withdrawn, delegates or agents removed, waits whose tool is
    gone. Exits 1 when any durable contract would be withdrawn, 0 otherwise, 2 when the app or
    the database cannot be read. On SQLite, stop the server first; on PostgreSQL it runs beside
    the servers.
    """
    from hearth.redeploy import check_database

    app = _load_app(app_ref, app_dir, code=2)
    try:
        report = asyncio.run(check_database(db if db is not None else app.settings.db, app.agents))
    except (HearthError, OSError) as exc:
        fail(str(exc) or type(exc).__name__, 2)
    except KeyboardInterrupt:
        sys.exit(130)  # (as the other commands: click said "Aborted!" and exit 1, "withdrawn")
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
    else:
        for line in report.lines():
            out.print(escape(line))
    sys.exit(1 if report.withdrawn else 0)


# --- gc --------------------------------------------------------------------------------------
@main.command()
@url_option
@token_option
@db_option("Collect in")
@click.option("--dry-run", is_flag=True, help="Only list what would be freed.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@friendly
def gc(url: str, token: str | None, db: str | None, dry_run: bool, as_json: bool) -> None:
    """Delete the attachments that no record and no submission references.

    It asks the running server (POST /admin/gc, behind its token; --url, HEARTH_URL), or with
    --db works on the database itself (a SQLite file only while no server has it open).
    """
    if db is not None:
        if click.get_current_context().get_parameter_source("url") is ParameterSource.COMMANDLINE:
            fail("give one of --db URL (the database) or --url URL (a running server)", 2)
        found = asyncio.run(_gc_database(db, dry_run))
    else:
        with Client(url, token) as client:
            found = client.gc(dry_run=dry_run)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    verb = "would free" if dry_run else "freed"
    for blob in found["deleted"]:
        click.echo(f"{blob['sha256']}  {blob['size']:>12}  {blob['media_type']}")
    click.echo(f"hearth: {verb} {found['count']} attachment(s), {found['bytes']} bytes")


async def _gc_database(db: str | None, dry_run: bool) -> dict[str, Any]:
    from hearth.app import open_database
    from hearth.config import shown_db

    try:
        store = await open_database(db, pg_pool=1, existing=True)
    except StoreError as exc:
        if any(busy in str(exc) for busy in ("another process owns", "in this process already")):
            fail(
                f"{shown_db(db)} is open in a running server (a SQLite file belongs to one"
                " process): stop it first, or use --url to ask the server",
                2,
            )
        raise
    try:
        freed = await store.collect_attachments(dry_run=dry_run)
    finally:
        await store.close()
    return {
        "dry_run": dry_run,
        "deleted": [b.to_json() for b in freed],
        "count": len(freed),
        "bytes": sum(b.size for b in freed),
    }


# --- migrate ---------------------------------------------------------------------------------
@main.command()
@click.option("--db", envvar="HEARTH_DB", default=None, help="Database URL (HEARTH_DB).")
@friendly
def migrate(db: str | None) -> None:
    """Create the database schema, or check that it is current.

    On PostgreSQL, many processes may run this at once: the schema is created once.
    """
    from hearth.app import open_database
    from hearth.config import shown_db

    async def run() -> str:
        store = await open_database(db, pg_pool=1)
        await store.close()
        # A PostgreSQL store names its schema and server; a SQLite file is its own schema.
        schema, where = getattr(store, "schema", None), getattr(store, "where", None)
        what = f"the schema {schema!r} in {where}" if schema and where else shown_db(db)
        found, now = store.schema_found, store.schema_version
        if found is None:
            return f"created {what} (schema version {now})"
        if found < now:
            return f"migrated {what} from schema version {found} to {now}"
        return f"{what} is current (schema version {now})"

    with err.status(f"migrating {shown_db(db)}…"):
        said = asyncio.run(run())
    click.echo(f"hearth: {said}")


def _attempts(sub: dict[str, Any]) -> str:
    """The attempts that count toward ``max_attempts``, of it; and those that do not (after a
    durable wait, or given back by a graceful shutdown), apart: "1/1 (+3 waits)", not "4/1"."""
    from hearth.store.rows import counted_attempts

    waits, releases = int(sub.get("waits") or 0), int(sub.get("releases") or 0)
    shown = f"{counted_attempts(int(sub['attempt']), waits, releases)}/{sub['max_attempts']}"
    apart = [
        f"+{n} {what}{'s' if n > 1 else ''}"
        for n, what in ((waits, "wait"), (releases, "restart"))
        if n
    ]
    return f"{shown} ({', '.join(apart)})" if apart else shown


# --- demo ------------------------------------------------------------------------------------
@main.command()
@friendly
def demo() -> None:
    """Watch a server die mid-tool and recover, live.

    Starts a real server on a SQLite file in a temporary folder, SIGKILLs it while a durable tool
    sleeps between its steps, restarts it and shows the recovery from the SSE stream (~10 s).
    """
    from hearth.demo import run_demo

    sys.exit(run_demo(out))


# --- one line per record ---------------------------------------------------------------------
def describe(record: dict[str, Any]) -> str:
    """A record as one line of rich markup: offset, type, and what it says."""
    kind = str(record.get("type"))
    summary = escape(_visible(_summary(kind, record)))  # what a model or a user wrote
    colour = {"submission_settled": "green", "signal": "yellow"}.get(kind, "cyan")
    if kind == "tool_outcome" and record.get("is_error"):
        colour = "red"
    return f"[dim]{record.get('offset', '?'):>5}[/dim] [{colour}]{kind}[/{colour}] {summary}"


def _short(value: Any, limit: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _content_text(content: Any) -> Any:
    """A message's content for a one-line view: its text, then each file as [name (type)]."""
    if not isinstance(content, list):
        return content
    words = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "attachment":
            words.append(f"[{part.get('name')} ({part.get('media_type')}, {part.get('size')} B)]")
        elif isinstance(part, dict) and part.get("type") == "text":
            words.append(str(part.get("text", "")))
        else:
            words.append(json.dumps(part, ensure_ascii=False))
    return " ".join(words)


def _summary(kind: str, r: dict[str, Any]) -> str:
    get = r.get
    match kind:
        case "conversation_created":
            return f"{get('conversation_id')}" + (
                f" (child of {get('parent')})" if get("parent") else ""
            )
        case "user_message":
            return _short(_content_text(get("content")))
        case "signal":
            return f"{get('signal_type')}: {_short(get('body'))}"
        case "assistant_message_started":
            return f"model {get('model')}"
        case "assistant_text_delta":
            return _short(get("delta"))
        case "assistant_tool_call":
            return f"{get('name')}({_short(get('arguments'), 60)}) id={get('tool_call_id')}"
        case "assistant_message_completed":
            return f"{get('stop_reason')}: {_short(get('text') or '')}"
        case "tool_outcome":
            mark = "error " if get("is_error") else ""
            return f"{get('name')} → {mark}{_short(get('content'))} ({get('duration_ms')} ms)"
        case "tool_results_committed":
            return ", ".join(get("tool_call_ids") or [])
        case "tool_step_settled":
            return f"{get('tool_call_id')} step {get('step')!r} = {_short(get('value'), 60)}"
        case "state_write":
            return f"{get('name')} = {_short(get('value'), 60)}"
        case "hook_seam_committed":
            return str(get("hook"))
        case "child_conversation_linked":
            return f"{get('tool_call_id')} → {get('child_conversation_id')}"
        case "compaction":
            return f"summary of {get('tokens_before')} tokens, kept from {get('first_kept_offset')}"
        case "wait_started":
            expires = get("expires_at") or "never"
            return (
                f"{get('wait_id')} {get('name')!r}: {_short(get('prompt'), 60)} (expires {expires})"
            )
        case "wait_resolved":
            if get("timed_out"):
                return f"{get('wait_id')} timed out"
            if get("aborted"):
                return f"{get('wait_id')} ended by an abort"
            return f"{get('wait_id')} = {_short(get('value'), 60)}"
        case "submission_settled":
            detail = get("reply") if get("outcome") == "completed" else get("error")
            return f"{get('outcome')}: {_short(detail or '')}"
    return _short({k: v for k, v in r.items() if k not in ("offset", "id", "type", "at")})
