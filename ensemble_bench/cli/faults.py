"""How every fault leaves ``ensbench`` and ``ensbench-lm-eval``: one ``error:`` line per mistake on stderr
and an exit code (0 done, 1 regression or environment fault, 2 user error, 70 a bug with its traceback,
130 interrupted, with the hint to resume only where the command resumes); a reader of stdout that went
away or a full stdout end quietly."""

from __future__ import annotations

import errno
import os
import stat
import sys
import traceback

import click
import typer

try:  # typer >= 0.2x parses with its own copy of click, whose exceptions are other classes
    from typer import _click as typer_click
except ImportError:
    typer_click = click
from rich.console import Console
from rich.text import Text

from ensemble_bench.errors import EnvironmentFault, UserError, causes, environment_fault, lines_of


def _classes(name: str) -> tuple[type[BaseException], ...]:
    """The exception classes called ``name`` in click, typer's copy of click and typer (where they exist)."""
    found = {getattr(getattr(module, "exceptions", None), name, None) for module in (click, typer_click, typer)}
    return tuple(c for c in found if isinstance(c, type) and issubclass(c, BaseException))


HELP_REQUESTS = _classes("NoArgsIsHelpError")
USAGE_ERRORS = _classes("ClickException")
INTERRUPTS = _classes("Abort") + (KeyboardInterrupt,)
INTERRUPTED = 130  # also what typer >= 0.2x returns for a Ctrl-C in non-standalone mode
BUG = 70  # EX_SOFTWARE


class PipeConsole(Console):
    """rich's Console, but a closed pipe raises BrokenPipeError (ended quietly by ``main``) instead of
    rich's own ``SystemExit(1)``."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


# what str.splitlines breaks at: shown escaped, so that a value echoed from the user keeps the error on one line
LINE_BREAKS = str.maketrans({c: repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"})


def _say(line: str, prefix: str = "error:") -> None:
    """One line on stderr, never read as markup; a broken stderr is no reason for a second fault."""
    try:
        shown = line.strip().translate(LINE_BREAKS)
        PipeConsole(stderr=True, highlight=False, soft_wrap=True).print(Text.assemble((prefix, "bold red"), " ", shown))
    except Exception:  # noqa: BLE001 - nothing left to tell the user with
        pass


_resumes = [False]  # whether the command under way keeps its work for the next run (``ensbench run``)


def set_resumable(resumes: bool) -> None:
    """Whether, from here on, an interrupt's line says that running the command again resumes it (each
    command starts without)."""
    _resumes[0] = resumes


def interrupted() -> int:
    """The interrupt's line: the resume hint only for a command that resumes (a report command resumes nothing)."""
    _say("run the same command again to resume" if _resumes[0] else "stopped before it finished", prefix="interrupted:")
    return INTERRUPTED


def _report_bug(err: BaseException) -> int:
    traceback.print_exception(type(err), err, err.__traceback__)
    _say("this is a bug in ensbench, not in your input: please report it with the traceback above")
    return BUG


def _stdout_reader_gone() -> bool:
    """Whether a broken pipe is stdout's: false only when stdout is a pipe whose reader is still there,
    so that a broken pipe of anything else is no reason to end quietly. Poll reports an error on the
    writing end of a pipe whose reading end is closed; /dev/null is what rich's own broken-pipe handler
    (typer's help) puts in stdout's place."""
    try:
        from select import POLLERR, POLLHUP, POLLOUT, poll  # not `import select`: a command has that name

        if os.path.samestat(os.fstat(sys.stdout.fileno()), os.stat(os.devnull)):
            return True
        poller = poll()
        poller.register(sys.stdout.fileno(), POLLOUT)
        return any(event & (POLLERR | POLLHUP) for _, event in poller.poll(0))
    except (ImportError, OSError, ValueError):  # no poll on this system, or stdout is no file: cannot tell
        return True


def _stdout_closed() -> int:
    """The reader of our output went away (`ensbench table RUN | head`): end quietly, as cat does,
    and point stdout at /dev/null so the interpreter's last flush cannot fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 0


def _stdout_full() -> bool:
    """Whether stdout takes no more bytes: it is /dev/full, or a file on a disk with no free space left."""
    try:
        fd = sys.stdout.fileno()
        found = os.fstat(fd)
        if os.path.exists("/dev/full") and os.path.samestat(found, os.stat("/dev/full")):
            return True
        return stat.S_ISREG(found.st_mode) and os.fstatvfs(fd).f_bavail == 0
    except (OSError, ValueError, AttributeError):  # stdout is no file: cannot tell
        return False


def _stdout_fault(err: BaseException) -> EnvironmentFault | None:
    """A full disk without a file name (a write to stdout) while stdout is full: stdout's fault, not the
    output folder's; stdout is pointed at /dev/null so that the interpreter's last flush cannot fail again."""
    if not any(isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT) and not cause.filename
               for cause in causes(err)) or not _stdout_full():
        return None
    _stdout_closed()
    return EnvironmentFault("cannot write to stdout: it is full (/dev/full, or a file on a full disk): send the "
                            "output elsewhere and run the same command again")


def exit_code(err: BaseException) -> int:
    """Tell the user about ``err`` (one line for every expected fault) and return the exit code."""
    if isinstance(err, BrokenPipeError) and _stdout_reader_gone():
        return _stdout_closed()
    if (stdout_fault := _stdout_fault(err)) is not None:
        return exit_code(stdout_fault)
    if isinstance(err, HELP_REQUESTS):  # no command given: the help, as click prints it
        err.show()
        return err.exit_code
    if isinstance(err, (UserError, EnvironmentFault)):
        for line in lines_of(err):  # several mistakes of a recipe: one `error:` line each
            _say(line)
        return err.exit_code
    if isinstance(err, USAGE_ERRORS):
        _say(f"{err.format_message()} (ensbench --help)")
        return err.exit_code
    if isinstance(err, INTERRUPTS):
        return interrupted()
    fault = environment_fault(err)
    return exit_code(fault) if fault is not None else _report_bug(err)
