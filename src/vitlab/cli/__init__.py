"""The `vitlab` command: one subcommand per job, each a module of this package that declares its flags, calls a
plain function of the library and prints what it returns.

A command module has NAME, HELP, an optional EPILOG (text, or a function made only when help is shown),
`add_arguments(parser)` and `run(args) -> exit code`; a new command is a module and a row of COMMANDS.

Usage errors exit with code 2 and one line saying what is wrong; other failures exit 1 with a message, and
`--debug` shows the traceback instead, with the same exit code.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence

from vitlab import __version__
from vitlab.cli import (
    ablate,
    analyze,
    bench,
    convert,
    dense,
    dense_probe,
    embed,
    export,
    fewshot,
    finetune,
    info,
    knn,
    linear_probe,
    models,
    predict,
    pretrain,
    pretrained,
    search,
    serve,
    train,
)
from vitlab.cli import eval as evaluate  # named so that it does not hide the builtin eval
from vitlab.cli.options import ArgumentParser
from vitlab.errors import VitlabError

# The subcommands, in the order `vitlab --help` lists them.
COMMANDS = (
    models,
    pretrained,
    convert,
    train,
    finetune,
    pretrain,
    ablate,
    fewshot,
    linear_probe,
    embed,
    dense,
    dense_probe,
    knn,
    search,
    evaluate,
    predict,
    bench,
    export,
    analyze,
    serve,
    info,
)

EXIT_CODES = """exit codes:
  0    done (train: finished, or stopped by SIGTERM with its state saved; serve: stopped by SIGTERM after
       answering the requests in flight)
  1    failed (predict: at least one input could not be classified; the others are still reported)
  2    a usage error: a bad option, value, path or data set, said in one line
  130  stopped by Ctrl-C (train: state saved; resume with: vitlab train --resume RUN)
  141  the reader of the output left early (| head); the output was cut, nothing else went wrong"""


def build_parser() -> ArgumentParser:
    """The parser of `vitlab`: its own flags, then one subcommand per row of COMMANDS, whose parsed options carry
    the module's `run` as `handler`. Builds without importing torch."""
    parser = ArgumentParser(
        prog="vitlab",
        description="Build, train, fine-tune, understand and ship ViTs.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    parser.add_argument("--version", action="version", version=f"vitlab {__version__}")
    # --debug after the subcommand too; SUPPRESS keeps a subcommand's default from overwriting `vitlab --debug`.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks of errors")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    for command in COMMANDS:
        subcommand = subcommands.add_parser(
            command.NAME,
            parents=[common],
            help=command.HELP,
            epilog=getattr(command, "EPILOG", None),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(subcommand)
        subcommand.set_defaults(handler=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run `vitlab` with `argv` (default: the process's arguments) and return its exit code (EXIT_CODES)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    handler: Callable[[argparse.Namespace], int] = args.handler
    from vitlab.hardware import command_chooses_threads, keep_freed_memory

    # Process-wide allocator settings, made here on purpose (for the command, not for a Python caller of the
    # library): glibc's malloc is told (mallopt) to keep freed memory for reuse, so every step of a training loop
    # reuses its memory instead of faulting fresh pages in (the measurements are in vitlab/hardware.py).
    # VITLAB_MALLOC=system, or a preloaded jemalloc or tcmalloc, leaves the allocator alone.
    keep_freed_memory()
    try:
        with command_chooses_threads():  # the command's threads follow vitlab's rule; a caller's keep its own
            code = handler(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below, not at interpreter exit
        return code
    except BrokenPipeError:
        # The reader left early (`vitlab predict ... | head`): end quietly, as command-line tools do. Point stdout
        # at /dev/null so that Python's own flush at exit does not raise again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool ended by a closed pipe
    except VitlabError as error:
        if args.debug:  # the traceback, and still the exit code a script tests for (2 for a usage error)
            traceback.print_exc()
        else:
            print(f"vitlab {args.command}: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # anything unforeseen: one line, the traceback only with --debug
        if args.debug:
            traceback.print_exc()
            return 1
        print(
            f"vitlab {args.command}: error: {type(error).__name__}: {error} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1
