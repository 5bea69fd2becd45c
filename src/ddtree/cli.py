"""`ddtree` command line: one subcommand per stage, each implemented in its own module.

Every subcommand module exposes `add_arguments(parser)` and `run(args) -> int`; they are
imported lazily so `ddtree --help` stays fast and a missing optional dependency only
affects the subcommand that needs it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train-pair": ("ddtree.models.train_cli", "train the embedded target + DFlash drafter pair"),
    "selfcheck": ("ddtree.pipeline.selfcheck", "check builder, retrieve encoder and verifiers on a device"),
    "serve": ("ddtree.server.cli", "run the SGLang-compatible reference server"),
    "bench": ("ddtree.bench.cli", "benchmarks: core, engine, acceptance, throughput, session"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddtree", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text)
        sub_parser.set_defaults(_module=module_name)
        module = importlib.import_module(module_name)
        module.add_arguments(sub_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Import only the chosen subcommand's module when one is named.
    if argv and argv[0] in SUBCOMMANDS:
        name = argv[0]
        module_name, help_text = SUBCOMMANDS[name]
        module = importlib.import_module(module_name)
        parser = argparse.ArgumentParser(prog=f"ddtree {name}", description=help_text)
        module.add_arguments(parser)
        args = parser.parse_args(argv[1:])
        return int(module.run(args) or 0)
    args = build_parser().parse_args(argv)
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
