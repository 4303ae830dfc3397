"""The app factory uvicorn imports in each worker of ``hearth serve --reload``."""

from __future__ import annotations

import json
import os

from hearth.server.asgi import HearthASGI
from hearth.server.serve import load_app

SPEC_VAR = "HEARTH_SERVE_SPEC"


def make() -> HearthASGI:
    spec = json.loads(os.environ[SPEC_VAR])
    app = load_app(spec["app"], spec["app_dir"])
    app.configure(**spec["options"])
    return app.asgi()
