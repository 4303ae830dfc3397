"""An app module that fails to import (``hearth check`` answers exit 2, one line)."""

raise RuntimeError("this version does not even import")
