"""``python -m hearth`` is the ``hearth`` command."""

from hearth.cli import main

if __name__ == "__main__":
    main(prog_name="hearth")
