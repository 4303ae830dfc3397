"""One measurement of one system for ``bench/peers.py``, run in a process of its own.

    python bench/_peer_cases.py SYSTEM CASE --backend sqlite|pg --where DIR_OR_URL --n N

SYSTEM is ``floor`` (raw commits), ``hearth``, ``langgraph`` or ``dbos``; CASE is ``step`` (one
tool stepping alone: a latency sample per durable step), ``concurrent`` (64 tool calls stepping at
once: aggregate steps/s) or ``e2e`` (a submission = a model turn, one tool call, a reply:
settled/s). ``--where`` is an empty directory (SQLite) or a fresh database's URL (PostgreSQL).
The last line printed is one JSON object: ``{"samples_ms": [...]}`` or ``{"per_s": x}``.

Every system is made as durable as hearth's default: SQLite in WAL mode with
``synchronous=FULL``, PostgreSQL with ``synchronous_commit=on``; LangGraph with
``durability="sync"`` (a checkpoint is committed before the next superstep starts).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypedDict

import hearth as h

WORKERS = 64  # tool calls (conversations, threads, workflows) stepping at once
BODY = "x" * 150  # about one step record


# --------------------------------------------------------------------------- floor


def _sqlite(path: Path) -> sqlite3.Connection:
    """One connection as hearth opens its own: WAL, ``synchronous=FULL`` and exclusive locking
    (the WAL index in the process's memory, no file locks per transaction)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60)
    conn.execute("PRAGMA locking_mode=EXCLUSIVE")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def floor_commit(backend: str, where: str) -> Callable[[], Callable[[], None]]:
    """A factory of committers; a call commits one row. On PostgreSQL each committer has its own
    connection; on SQLite they share the one connection that exclusive locking allows (callers
    take turns, as SQLite's single writer makes them anyway)."""
    shared: list[Callable[[], None]] = []

    def sqlite_committer() -> Callable[[], None]:
        if shared:
            return shared[0]
        conn = _sqlite(Path(where) / "floor.db")
        conn.execute("CREATE TABLE IF NOT EXISTS t (id TEXT PRIMARY KEY, body TEXT)")

        def commit() -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t VALUES (?, ?)", (uuid.uuid4().hex, BODY))
            conn.execute("COMMIT")

        shared.append(commit)
        return commit

    def pg_committer() -> Callable[[], None]:
        import psycopg

        conn = psycopg.connect(where)
        conn.execute("CREATE TABLE IF NOT EXISTS t (id text PRIMARY KEY, body text)")
        conn.commit()

        def commit() -> None:
            conn.execute("INSERT INTO t VALUES (%s, %s)", (uuid.uuid4().hex, BODY))
            conn.commit()

        return commit

    return sqlite_committer if backend == "sqlite" else pg_committer


def floor(case: str, backend: str, where: str, n: int) -> dict[str, Any]:
    make = floor_commit(backend, where)
    if case == "step":
        commit = make()
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            commit()
            samples.append(time.perf_counter() - t0)
        return {"samples_ms": [s * 1000 for s in samples]}
    if case == "concurrent":
        committers = [make() for _ in range(WORKERS)]
        per = max(1, n // WORKERS)
        lock = threading.Lock() if backend == "sqlite" else None  # one SQLite writer at a time

        def work(commit: Callable[[], None]) -> None:
            for _ in range(per):
                if lock is None:
                    commit()
                else:
                    with lock:
                        commit()

        t0 = time.perf_counter()
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(work, committers))
        return {"per_s": per * WORKERS / (time.perf_counter() - t0)}
    return {"per_s": None}


# --------------------------------------------------------------------------- hearth


def hearth_url(backend: str, where: str) -> str:
    if backend == "sqlite":
        return f"sqlite:///{Path(where) / 'hearth.db'}?synchronous=FULL"
    return where


def hearth(case: str, backend: str, where: str, n: int) -> dict[str, Any]:
    from hearth.providers.base import ModelRequest, ToolResult
    from hearth.testing import ScriptedModel, Step, call, calls, reply

    url = hearth_url(backend, where)
    if case == "step":
        from step_overhead import measure_step_do

        samples = asyncio.run(measure_step_do(n, url))
        return {"samples_ms": [s * 1000 for s in samples]}

    spans: list[tuple[float, float]] = []

    @h.tool(durable=True)
    async def stepper(k: int, ctx: h.ToolContext) -> int:
        """Run k empty steps."""
        t0 = time.perf_counter()
        for i in range(k):
            await ctx.step.do(f"s{i}", lambda: 1)
        spans.append((t0, time.perf_counter()))
        return k

    @h.tool
    async def lookup(key: str) -> str:
        """Look a key up."""
        return key.upper()

    @h.agent
    def worker(ctx: h.AgentContext) -> str:
        ctx.use_model("scripted/bench")
        ctx.use_tool(stepper)
        ctx.use_tool(lookup)
        return ""

    per = max(1, n // WORKERS)

    def script(request: ModelRequest) -> Step:
        if isinstance(request.messages[-1], ToolResult):
            return reply("done")
        if case == "concurrent":
            return calls(call("stepper", k=per))
        return calls(call("lookup", key="k"))

    async def run() -> dict[str, Any]:
        app = h.App([worker], db=url, providers=[ScriptedModel("bench", script)])
        async with app.run() as rt:
            if case == "concurrent":
                receipts = [await rt.dispatch("worker", f"c{i}", "go") for i in range(WORKERS)]
                await asyncio.gather(*(rt.read(r, timeout=600) for r in receipts))
                first = min(a for a, _ in spans)
                last = max(b for _, b in spans)
                return {"per_s": per * WORKERS / (last - first)}
            t0 = time.perf_counter()
            receipts = await asyncio.gather(
                *(rt.dispatch("worker", f"c{i % WORKERS}", f"m{i}") for i in range(n))
            )
            await asyncio.gather(*(rt.read(r, timeout=600) for r in receipts))
            return {"per_s": n / (time.perf_counter() - t0)}

    return asyncio.run(run())


# --------------------------------------------------------------------------- LangGraph


class Counter(TypedDict):
    """A superstep counter (module level, so that its type hints resolve)."""

    i: int
    until: int


class Turn(TypedDict, total=False):
    """One agent turn: the model asks for a tool, the tool answers, the model replies."""

    message: str
    call: str
    result: str
    reply: str


def langgraph_saver(backend: str, where: str) -> tuple[Any, Callable[[], None]]:
    if backend == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = _sqlite(Path(where) / "langgraph.db")
        conn.isolation_level = ""  # the saver commits its own transactions
        saver = SqliteSaver(conn)
        saver.setup()
        return saver, conn.close
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    pool = ConnectionPool(where, min_size=4, max_size=WORKERS, kwargs=kwargs)
    saver = PostgresSaver(pool)  # type: ignore[arg-type]
    saver.setup()
    return saver, pool.close


def langgraph(case: str, backend: str, where: str, n: int) -> dict[str, Any]:
    from langgraph.graph import END, START, StateGraph

    saver, close = langgraph_saver(backend, where)
    entries: list[float] = []
    try:
        if case in ("step", "concurrent"):

            def node(state: Counter) -> dict[str, int]:
                entries.append(time.perf_counter())
                return {"i": state["i"] + 1}

            def again(state: Counter) -> str:
                return "node" if state["i"] < state["until"] else END

            builder: Any = StateGraph(Counter)
            builder.add_node("node", node)
            builder.add_edge(START, "node")
            builder.add_conditional_edges("node", again, ["node", END])
            graph = builder.compile(checkpointer=saver)

            def steps(thread: str, k: int) -> None:
                config: Any = {"configurable": {"thread_id": thread}, "recursion_limit": k + 10}
                graph.invoke({"i": 0, "until": k}, config, durability="sync")

            if case == "step":
                steps("t", n)
                return {"samples_ms": [(b - a) * 1000 for a, b in itertools.pairwise(entries)]}
            per = max(1, n // WORKERS)
            t0 = time.perf_counter()
            with ThreadPoolExecutor(WORKERS) as pool:
                list(pool.map(lambda i: steps(f"t{i}", per), range(WORKERS)))
            return {"per_s": per * WORKERS / (time.perf_counter() - t0)}

        def model(state: Turn) -> Turn:
            return {"reply": "done"} if "result" in state else {"call": "lookup"}

        def tool(state: Turn) -> Turn:
            return {"result": state["message"].upper()}

        def route(state: Turn) -> str:
            return END if "reply" in state else "tool"

        builder = StateGraph(Turn)
        builder.add_node("model", model)
        builder.add_node("tool", tool)
        builder.add_edge(START, "model")
        builder.add_conditional_edges("model", route, ["tool", END])
        builder.add_edge("tool", "model")
        graph = builder.compile(checkpointer=saver)

        def submit(i: int) -> None:
            config: Any = {"configurable": {"thread_id": f"s{i}"}}
            graph.invoke({"message": f"m{i}"}, config, durability="sync")

        t0 = time.perf_counter()
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(submit, range(n)))
        return {"per_s": n / (time.perf_counter() - t0)}
    finally:
        close()


# --------------------------------------------------------------------------- DBOS


def _dbos_pragmas(dbapi_conn: Any, _record: Any) -> None:
    if isinstance(dbapi_conn, sqlite3.Connection):
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA synchronous=FULL")


def dbos(case: str, backend: str, where: str, n: int) -> dict[str, Any]:
    import sqlalchemy as sa
    from dbos import DBOS, DBOSConfig

    samples: list[float] = []

    @DBOS.step()
    async def noop() -> int:
        return 1

    @DBOS.step()
    async def lookup(key: str) -> str:
        return key.upper()

    @DBOS.workflow()
    async def stepping(k: int, timed: bool) -> int:
        for _ in range(k):
            t0 = time.perf_counter()
            await noop()
            if timed:
                samples.append(time.perf_counter() - t0)
        return k

    @DBOS.workflow()
    async def submission(message: str) -> str:
        asked = await noop()  # the model's turn
        result = await lookup(message)  # the tool call
        await noop()  # the model's reply
        return f"{asked} {result}"

    url = f"sqlite:///{Path(where) / 'dbos.sqlite'}" if backend == "sqlite" else where
    if backend == "sqlite":
        sa.event.listen(sa.engine.Engine, "connect", _dbos_pragmas)
    config: DBOSConfig = {"name": "peers-bench", "system_database_url": url}
    config["log_level"] = "WARNING"
    DBOS(config=config)
    try:
        DBOS.launch()

        async def run() -> dict[str, Any]:
            if case == "step":
                await stepping(n, True)
                return {"samples_ms": [s * 1000 for s in samples]}
            if case == "concurrent":
                per = max(1, n // WORKERS)
                t0 = time.perf_counter()
                await asyncio.gather(*(stepping(per, False) for _ in range(WORKERS)))
                return {"per_s": per * WORKERS / (time.perf_counter() - t0)}
            gate = asyncio.Semaphore(WORKERS)

            async def one(i: int) -> None:
                async with gate:
                    await submission(f"m{i}")

            t0 = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(n)))
            return {"per_s": n / (time.perf_counter() - t0)}

        return asyncio.run(run())
    finally:
        DBOS.destroy()


SYSTEMS: dict[str, Callable[[str, str, str, int], dict[str, Any]]] = {
    "floor": floor,
    "hearth": hearth,
    "langgraph": langgraph,
    "dbos": dbos,
}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("system", choices=sorted(SYSTEMS))
    parser.add_argument("case", choices=["step", "concurrent", "e2e"])
    parser.add_argument("--backend", choices=["sqlite", "pg"], default="sqlite")
    parser.add_argument("--where", required=True)
    parser.add_argument("--n", type=int, default=500)
    args = parser.parse_args()
    found = SYSTEMS[args.system](args.case, args.backend, args.where, args.n)
    print(json.dumps(found))
