"""The ``App``: agents, providers, a store and settings, runnable in-process or behind HTTP; and
``load_app``, which finds one by its import path (``hearth serve module:app``)."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from hearth._tasks import run_to_end
from hearth.agent import Agent
from hearth.channels import Channel
from hearth.config import Settings, check_db_url, shown_db
from hearth.errors import ConfigurationError, HearthError, StoreError
from hearth.providers.base import ModelProvider
from hearth.providers.registry import ProviderRegistry
from hearth.runtime.env import Env
from hearth.runtime.metrics import Metrics
from hearth.runtime.runtime import Runtime
from hearth.schedules import Schedule
from hearth.store import Store, open_store

if TYPE_CHECKING:
    from hearth.server import HearthASGI


def _builtin_providers() -> list[ModelProvider]:
    from hearth.providers import default_providers

    return list(default_providers())


class App:
    """A set of agents and how to run them.

    Example::

        app = hearth.App([support], db="sqlite:///support.db")
        async with app.run() as rt:
            reply = await rt.read(await rt.dispatch("support", "c-1", "hello"))
    """

    def __init__(
        self,
        agents: Sequence[Agent],
        *,
        channels: Sequence[Channel] = (),
        schedules: Sequence[Schedule] = (),
        db: str | None = None,
        providers: Sequence[ModelProvider] = (),
        token: str | None = None,
        host: str | None = None,
        port: int | None = None,
        lease_s: float | None = None,
        heartbeat_s: float | None = None,
        scan_s: float | None = None,
        workers: int | None = None,
        max_body: int | None = None,
        max_attachment: int | None = None,
        max_upload: int | None = None,
        shutdown_s: float | None = None,
        pg_pool: int | None = None,
        schedule_clock: Callable[[], float] | None = None,
        max_streams: int | None = None,
        log_format: str | None = None,
    ) -> None:
        if isinstance(agents, Agent) or not isinstance(agents, Sequence | set | frozenset):
            raise ConfigurationError(
                f"App expects a list of @hearth.agent functions, got {agents!r}"
            )
        self.agents: dict[str, Agent] = {}
        for agent in agents:
            if not isinstance(agent, Agent):
                raise ConfigurationError(f"App expects @hearth.agent functions, got {agent!r}")
            if agent.name in self.agents and self.agents[agent.name] is not agent:
                raise ConfigurationError(f"two agents are named {agent.name!r}")
            self.agents[agent.name] = agent
        self.channels = _named(channels, Channel, "channel")
        self.schedules = _named(schedules, Schedule, "schedule")
        for schedule in self.schedules.values():
            if schedule.agent not in self.agents:
                raise ConfigurationError(
                    f"schedule {schedule.name!r}: no agent named {schedule.agent!r}; declared:"
                    f" {', '.join(sorted(self.agents))}"
                )
        # Tests only: the clock schedules are judged by (default: the store's). Never leases.
        self.schedule_clock = schedule_clock
        self._given: dict[str, Any] = dict(
            db=db,
            token=token,
            host=host,
            port=port,
            lease_s=lease_s,
            heartbeat_s=heartbeat_s,
            scan_s=scan_s,
            workers=workers,
            max_body=max_body,
            max_attachment=max_attachment,
            max_upload=max_upload,
            shutdown_s=shutdown_s,
            pg_pool=pg_pool,
            max_streams=max_streams,
            log_format=log_format,
        )
        self.settings = Settings.resolve(**self._given)
        self.providers = ProviderRegistry(providers, builtins=_builtin_providers)
        self.metrics = Metrics()
        self._running = 0  # runtimes of this app not yet stopped: they share its providers

    def configure(self, **overrides: Any) -> None:
        """Apply ``hearth serve`` options: they win over the environment, but an explicit
        ``App(...)`` argument wins over them."""
        merged = {k: v for k, v in overrides.items() if v is not None}
        merged.update({k: v for k, v in self._given.items() if v is not None})
        self.settings = Settings.resolve(**merged)

    @asynccontextmanager
    async def run(self) -> AsyncIterator[Runtime]:
        """Open the store and start the coordinator; stop gracefully on exit."""
        store = await open_database(self.settings.db, pg_pool=self.settings.pg_pool)
        self._running += 1
        runtime: Runtime | None = None
        try:
            env = Env(
                store=store, agents=self.agents, providers=self.providers, metrics=self.metrics
            )
            runtime = Runtime(
                env,
                self.settings,
                channels=list(self.channels.values()),
                schedules=list(self.schedules.values()),
                schedule_clock=self.schedule_clock,
            )
            await runtime.start()
            yield runtime
        finally:
            # Cancelled again while it stops (an anyio cancel scope cancels at every await),
            # the stop closed the store under the attempts it had yet to give back.
            await run_to_end(self._stop(runtime, store))

    async def _stop(self, runtime: Runtime | None, store: Store) -> None:
        try:
            if runtime is not None:
                await runtime.stop()
        finally:
            try:
                await store.close()
            finally:
                self._running -= 1  # (a close that raised still ends this runtime's share)
                if self._running == 0:
                    # Their HTTP connections, remade on next use; not while another runtime of
                    # this app (another database, another thread's loop) may be streaming on
                    # them.
                    await self.providers.aclose()

    def asgi(self, *, sse_heartbeat_s: float = 15.0) -> HearthASGI:
        """The HTTP API (docs/http.md) as an ASGI app: run it with any ASGI server, or mount it.

        Its lifespan starts and stops the runtime; mounted inside another Starlette/FastAPI
        app (whose mounts get no lifespan) it starts on the first request, or pass
        ``lifespan=api.lifespan`` to the outer app. Example::

            api = app.asgi()
            outer = Starlette(routes=[Mount("/hearth", api)], lifespan=api.lifespan)
        """
        from hearth.server import build_asgi

        return build_asgi(self, sse_heartbeat_s=sse_heartbeat_s)


T = TypeVar("T", Channel, Schedule)


def _named(items: Sequence[T], kind: type[T], what: str) -> dict[str, T]:
    named: dict[str, T] = {}
    for item in items:
        if not isinstance(item, kind):
            raise ConfigurationError(f"App expects hearth.{kind.__name__} {what}s, got {item!r}")
        if item.name in named:
            raise ConfigurationError(f"two {what}s are named {item.name!r}")
        named[item.name] = item
    return named


async def open_database(db: str | None, *, pg_pool: int = 10, existing: bool = False) -> Store:
    """Open the store ``db`` names, creating or checking its schema; with ``existing``, a
    database without hearth's schema (a SQLite file that is not there, a PostgreSQL schema
    that is not) is a ``StoreError`` (a command that reads or changes what is stored must not
    make an empty database where a path was mistyped).

    A failure the store did not type (a driver's error, such as a role that may not create the
    schema) becomes one ``StoreError`` line, so ``hearth serve`` and ``hearth migrate`` print it
    without a traceback.
    """
    check_db_url(db)
    store = open_store(db, pg_pool=pg_pool)
    try:
        await store.open(create=not existing)
    except BaseException as exc:
        # What it opened before it failed or was given up on (a pool, a listener, the file's
        # lock) is closed, not left to serve nobody.
        with contextlib.suppress(Exception):
            await run_to_end(store.close())
        if isinstance(exc, HearthError | OSError) or not isinstance(exc, Exception):
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise StoreError(f"cannot open the database {shown_db(db)}: {first}") from exc
    return store


def load_app(ref: str, app_dir: str | None = ".") -> App:
    """Import ``module:attribute`` (default attribute ``app``) and check it is a ``hearth.App``.

    ``app_dir`` goes first on ``sys.path``, as uvicorn does, so that ``hearth serve myapp:app``
    finds ``./myapp.py``.
    """
    module_name, _, attr = ref.partition(":")
    if not module_name or module_name.startswith("."):
        raise ConfigurationError(
            f"{ref!r}: name the app as module:attribute, e.g. myapp:app (not a relative module)"
        )
    if app_dir is not None:
        folder = os.path.abspath(app_dir)
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # The module itself (or a package on its path) is missing, not something it imports:
        # "agents_api" importing a missing "agents" is the module's own error.
        if exc.name and (exc.name == module_name or module_name.startswith(exc.name + ".")):
            raise ConfigurationError(
                f"cannot import {module_name!r}: no such module (run from its folder, or use"
                " --app-dir)"
            ) from None
        raise
    target = getattr(module, attr or "app", None)
    if not isinstance(target, App):
        raise ConfigurationError(
            f"{module_name}:{attr or 'app'} is not a hearth.App"
            + (" (it does not exist)" if target is None else f" but {type(target).__name__}")
        )
    return target
