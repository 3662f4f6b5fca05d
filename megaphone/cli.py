"""The ``megaphone`` command: ``demo`` (live migration on embedded Spark) and the planner tools.

Each subcommand lives in its own module and registers itself through :data:`COMMANDS`; errors
a user can fix (bad arguments, bad state directories, bad plans) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from megaphone._version import __version__

#: subcommand -> module that defines ``add_arguments(parser)`` and ``run(args) -> int``.
COMMANDS: dict[str, str] = {
    "demo": "megaphone.demo",
    "inspect": "megaphone.inspect_cmd",
    "plan": "megaphone.plan_cmd",
    "migrate": "megaphone.migrate_cmd",
    "explain": "megaphone.explain_cmd",
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="megaphone",
        description="Move keyed streaming state between Spark workers while the stream runs.",
    )
    parser.add_argument("--version", action="version", version=f"megaphone {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        doc = (module.__doc__ or "").strip().splitlines()[0]
        command = sub.add_parser(name, help=doc, description=doc)
        module.add_arguments(command)
        command.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(args._module.run(args) or 0)
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading
        sys.stderr.close()
        return 0
    except (ValueError, OSError) as exc:
        print(f"megaphone {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
