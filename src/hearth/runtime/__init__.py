"""The runtime: coordinator, turn loop and recovery."""

from hearth.runtime.runtime import Runtime

__all__ = ["Runtime"]
