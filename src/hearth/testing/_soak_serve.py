"""``hearth serve`` for the soak, started ahead of time: the process imports the CLI, the server
and the app, then waits for one line on stdin — a JSON object of environment variables for this
run (``HEARTH_CRASH_RUN``, ``HEARTH_CRASH_AT``) — and only then runs ``hearth serve`` with the
arguments it was given. A restart after a kill then costs the database's opening and recovery,
not the imports. An empty stdin (the soak is done) exits without serving.
"""

from __future__ import annotations

import json
import os
import sys

import hearth.app
import hearth.cli
import hearth.server.serve
from hearth import _faults


def main() -> None:
    app_ref = sys.argv[1]
    hearth.app.load_app(app_ref, ".")
    line = sys.stdin.readline()
    if not line.strip():
        return
    os.environ.update(json.loads(line))
    _faults.configure(os.environ.get("HEARTH_CRASH_AT"))
    hearth.cli.main(["serve", *sys.argv[1:]], prog_name="hearth")


if __name__ == "__main__":
    main()
