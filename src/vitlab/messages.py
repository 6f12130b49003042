"""What vitlab's library code tells its user (a run's notes, epoch lines and summary, an ablation's progress, a
bench's steps, the calibration) goes through one `logging` logger, "vitlab", by `say`, never by `print`: so a
Python user can silence or capture it, and the CLI prints the same lines as before.

The logger has one handler of its own, CONSOLE, which writes each message as it is (no level, no time) to the
process's stdout, or to its stderr for messages said `to_stderr` and for warnings and errors (with their
traceback: `vitlab.serve`'s), looked up at each message so that a redirect or pytest's capture sees it. Messages
also go on to the root logger's handlers, as any logger's do (pytest's `caplog` reads them there).

To silence vitlab: `logging.getLogger("vitlab").setLevel(logging.WARNING)`. To send its messages only to your own
logging set-up: `logging.getLogger("vitlab").removeHandler(vitlab.messages.CONSOLE)`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

LOGGER = logging.getLogger("vitlab")
# Where importing torchao (pt2e int8; peft and transformers import it when installed) speaks: that its CUDA kernels
# cannot load on a CPU build, and torch's deprecation notes on its pytree registrations. Nothing a user can act on.
TORCHAO_LOGGERS = ("torchao", "torch.utils._pytree")


class ConsoleHandler(logging.Handler):
    """Each message as it is, on the stdout (or stderr) of the moment, flushed at once (a run's lines are read as
    they come, by people and by the tests that start runs in other processes)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            to_stderr = getattr(record, "to_stderr", False) or record.levelno >= logging.WARNING
            stream = sys.stderr if to_stderr else sys.stdout
            stream.write(self.format(record) + "\n")  # the message, and an exception's traceback after it
            stream.flush()
        except Exception:  # noqa: BLE001 - logging's own rule: a handler's failure never stops the program
            self.handleError(record)


CONSOLE = ConsoleHandler()
if not LOGGER.handlers:  # once, even where the module is loaded twice
    LOGGER.addHandler(CONSOLE)
    LOGGER.setLevel(logging.INFO)


def say(text: str, to_stderr: bool = False) -> None:
    """Tell the user `text` (one or more lines), at INFO level; `to_stderr` for what the CLI writes to stderr
    (progress while a result is being made, failures of a part)."""
    LOGGER.info(text, extra={"to_stderr": to_stderr})


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` and its noun in the number it takes: "1 unreadable file", "3 unreadable files", "0 pairs".
    plural: where the noun does not take an "s" ("1 process", plural "processes")."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def unreadable_line(unreadable: list[str], left: str = "left out") -> str:
    """ "1 unreadable file left out: a.jpg: why" / "3 unreadable files left out: a.jpg: why, ...": the count and
    the first, with "..." only where there are more."""
    more = ", ..." if len(unreadable) > 1 else ""
    return f"{counted(len(unreadable), 'unreadable file')} {left}: {unreadable[0]}{more}"


@contextlib.contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """Raise the given loggers to ERROR for a while: the exporter notes that torchvision is missing and the
    quantizer suggests a pre-processing step, neither of which the user can or needs to act on. A handler the
    library puts on the root logger meanwhile is taken off again: ONNX Runtime's static quantizer calls
    `logging.basicConfig`, after which every later vitlab message was printed twice ("INFO:vitlab:...")."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    root_handlers = list(logging.root.handlers)
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
        for handler in [handler for handler in logging.root.handlers if handler not in root_handlers]:
            logging.root.removeHandler(handler)
