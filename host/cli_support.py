"""What every ringgpt command line shares: one line per error, the exit codes, --debug, and option checks.

The exit codes are EXIT_CODES (every help text derives its "Exit status" from it). Errors are printed as one line on
stderr ("error: what, where, what to do"), environment faults included (a full disk, a folder that cannot be
written, standard output closed or full: `report`); --debug (or RINGGPT_DEBUG=1) lets them through with their
traceback. This module imports only click, so `--help` and option errors stay fast.
"""
from __future__ import annotations

import errno
import json
import os
import sys
import warnings

import click
from click.core import ParameterSource

from ringgpt.host.errors import RingGPTError
from ringgpt.hw.config import MAX_CARDS

EXIT_OK = 0
EXIT_FAULT = 1
"""A failed device run, or an internal fault (a bug in ringgpt)."""
EXIT_DEVICE_ERROR = EXIT_FAULT
EXIT_USER_ERROR = 2
EXIT_CHECK_FAILED = 3
"""The appliance disagrees with the PyTorch FP32 reference beyond the stated bound (`generate`'s check, `check`)."""
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
"""Standard output was closed by its reader (`ringgpt generate | head -1`): ringgpt stops quietly with the status a
shell reports for a Unix tool that SIGPIPE ended (128 + 13), so `set -o pipefail` sees it as it sees `yes | head`."""
EXIT_CODES = {
    EXIT_OK: "ok",
    EXIT_FAULT: "a failed device run or an internal fault",
    EXIT_USER_ERROR: "bad input or an environment you can fix (options, prompt, model, files, a full disk, a folder "
                     "that cannot be written)",
    EXIT_CHECK_FAILED: "the appliance's result is outside its accuracy bound",
    EXIT_INTERRUPTED: "interrupted",
    EXIT_BROKEN_PIPE: "standard output was closed early (a pipe into head): stopped quietly",
}
"""Every exit status of ringgpt's command lines and what it means: the one definition."""
DEBUG_ENV = "RINGGPT_DEBUG"


def exit_status_help(meanings: dict[int, str] | None = None) -> str:
    """The "Exit status" text of a --help: EXIT_CODES, with a command's own wording where `meanings` gives one (None:
    a status the command never returns)."""
    meanings = {**EXIT_CODES, **(meanings or {})}
    return "Exit status: " + "; ".join(f"{code} {meanings[code]}" for code in EXIT_CODES
                                        if meanings[code] is not None) + "."


EXIT_STATUS_HELP = exit_status_help()
_debug = False


MODEL_HELP = ("bundled | PATH (Hugging Face GPT-2 checkpoint directory) | synthetic:SIZE | "
              "synthetic:n_layer=..,n_embd=..,n_head=..")


def model_option(function):
    """--model: which GPT-2 (every command that loads one)."""
    return click.option("--model", default="bundled", show_default=True, help=MODEL_HELP)(function)


def config_options(where: str = ""):
    """--config and --cards (1..MAX_CARDS): the architecture preset and the cards on the ring; `where` is
    appended to their help (e.g. ' (sim backend)')."""
    def decorate(function):
        function = click.option("--cards", type=click.IntRange(1, MAX_CARDS), default=None,
                                help=f"cards on the ring{where}  [default: {MAX_CARDS}, or the -xN of --config]")(function)
        return click.option("--config", "config_name", default="u280", show_default=True,
                            help=f"architecture preset, optionally with its card count: u280, u280-x2{where}")(function)
    return decorate


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    global _debug
    _debug = _debug or bool(value)


def debug_option(function):
    """--debug: let errors through with their Python traceback (for reporting a bug)."""
    return click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_set_debug,
                        help="show the Python traceback of an error instead of one line")(function)


def debugging() -> bool:
    return _debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    click.echo(f"warning: {_one_line(message)}", err=True)


FIXES = {
    errno.ENOSPC: "free some space or write elsewhere",
    errno.EDQUOT: "free some space (your disk quota is used up) or write elsewhere",
    errno.EACCES: "check its permissions or choose another place",
    errno.EPERM: "check its permissions or choose another place",
    errno.EROFS: "choose a place on a writable file system",
    errno.ENOTDIR: "a part of the path is a file, not a folder: fix the path",
    errno.EISDIR: "it is a folder: give a file",
    errno.ENOENT: "check the path",
    errno.EEXIST: "remove it or choose another path",
    errno.ENAMETOOLONG: "choose a shorter path",
    errno.ELOOP: "fix the symbolic links in the path",
    errno.EMFILE: "raise the limit on open files (ulimit -n)",
    errno.ENFILE: "close other programs or raise the system's limit on open files",
}
"""Operating-system errors that the user's environment causes and the user can fix (exit 2), and what to do."""


STREAMS = {1: "standard output", 2: "standard error"}


def _failed_stream(exc: OSError) -> str | None:
    """The standard stream that `exc` was raised writing to, if any: the innermost frame of its traceback (the code
    that called write or flush) holds that stream, or an object whose `file` it is (a rich Console)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    for value in (tb.tb_frame.f_locals.values() if tb is not None else ()):
        for stream in (value, getattr(value, "file", None)):
            try:
                fd = stream.fileno()
            except Exception:  # noqa: BLE001 - not a stream, or a closed one
                continue
            if fd in STREAMS:
                return STREAMS[fd]
    return None


def _where(exc: OSError) -> str:
    """What an OSError happened on: a standard stream, else its path(s), naming the image cache where the path lies
    in it."""
    stream = _failed_stream(exc)
    if stream is not None:
        return f"cannot write to {stream}"
    if exc.filename is None:
        return "a file ringgpt uses"
    where = str(exc.filename) + ("" if exc.filename2 is None else f" -> {exc.filename2}")
    images = sys.modules.get("ringgpt.host.runtime.images")  # loaded when the error can be the cache's
    if images is not None and os.path.abspath(where).startswith(os.path.abspath(images.cache_root()) + os.sep):
        where += f" (the image cache: set {images.CACHE_ENV} to a folder you can write)"
    return where


def _os_error(exc: OSError) -> int:
    """Prints an operating-system error as one line naming the path or stream and what to do, and returns its code;
    a closed standard output (EPIPE) ends quietly, as Unix tools do, its descriptor pointed at /dev/null so that
    Python's flush at exit does not fail on it again."""
    if exc.errno == errno.EPIPE:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, sys.stdout.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):  # no descriptor (a test's stream): nothing to silence
            pass
        return EXIT_BROKEN_PIPE
    where = _where(exc)
    text = exc.strerror or str(exc)
    what = text[:1].lower() + text[1:] + (f" ({errno.errorcode[exc.errno]})" if exc.errno in errno.errorcode else "")
    fix = FIXES.get(exc.errno)
    click.echo(f"error: {where}: {_one_line(what)}" + (f": {fix}" if fix else ""), err=True)
    return EXIT_USER_ERROR if fix else EXIT_FAULT


def report(exc: BaseException) -> int:
    """Prints `exc` as one line on stderr and returns the exit code for it."""
    if isinstance(exc, RingGPTError):
        click.echo(f"{exc.label}: {_one_line(exc)}", err=True)
        return exc.exit_code
    if isinstance(exc, (KeyboardInterrupt, click.exceptions.Abort)):
        click.echo("interrupted", err=True)
        return EXIT_INTERRUPTED
    if isinstance(exc, OSError):
        return _os_error(exc)
    click.echo(f"internal error: {type(exc).__name__}: {_one_line(exc)} (a fault in ringgpt, not in your input: "
               "rerun with --debug for the traceback and report it)", err=True)
    return EXIT_FAULT


def _exit_for(exc: BaseException):
    """Exits with `exc` reported as one line (raises it again under --debug)."""
    if debugging():
        raise exc
    sys.exit(report(exc))


class _Guarded:
    """Mixed into click commands: runs them in standalone mode with ringgpt's error handling."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent, **extra)
        except OSError as exc:  # --help written to a closed pipe or a full disk
            _exit_for(exc)

    def invoke(self, ctx: click.Context):
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _show_warning
                return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - every error becomes one line and a code
            _exit_for(exc)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        global _debug
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        _debug = False
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            click.echo(f"error: {_one_line(exc.format_message())}{hint}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.exceptions.Abort as exc:
            sys.exit(report(exc))
        sys.exit(code if isinstance(code, int) else EXIT_OK)


class Group(_Guarded, click.Group):
    """A click group with ringgpt's error handling."""


class Command(_Guarded, click.Command):
    """A click command with ringgpt's error handling (for a command used on its own, like the compiler's)."""


def given(ctx: click.Context, name: str) -> bool:
    """Whether the parameter `name` was given (on the command line or in the environment), not defaulted."""
    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def option_name(ctx: click.Context, name: str) -> str:
    param = next(p for p in ctx.command.params if p.name == name)
    return max(param.opts, key=len)


def reject_unused(ctx: click.Context, names, here: str, use: str) -> None:
    """Raises click.UsageError for options among `names` that were given although they do nothing `here` (they
    are for `use`)."""
    unused = [option_name(ctx, n) for n in names if given(ctx, n)]
    if unused:
        one = len(unused) == 1
        raise click.UsageError(f"{', '.join(unused)} {'does' if one else 'do'} nothing {here}: "
                               f"{'it is' if one else 'they are'} for {use}", ctx)


def arch_config(config_name: str, cards: int | None):
    """The architecture config for --config and --cards (default 4 cards unless the name says -xN)."""
    from ringgpt.hw.config import get_config

    if cards is None and "-x" not in config_name:
        cards = 4
    return get_config(config_name, cards)


CHECK_REPORT_MARK = {"kind": "ringgpt check report"}
"""The field that marks the JSON report of `ringgpt check --json` (check_report.write_json writes it): a later --json may
replace a file that has it, and no other file."""


def _is_check_report(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.items() >= CHECK_REPORT_MARK.items()


def check_report_target(path: str) -> None:
    """Raises OutputError unless `path` may take a check report: a new file in an existing folder, or a report that
    ringgpt check wrote before; never a symbolic link, a folder or any other file."""
    from ringgpt.host.errors import OutputError

    parent = os.path.dirname(os.path.abspath(path))
    if os.path.islink(path):
        raise OutputError(f"--json {path} is a symbolic link: ringgpt neither writes through nor replaces one; give "
                          "the path of a new file or of an earlier report")
    if os.path.isdir(path):
        raise OutputError(f"--json {path} is a folder: give a file name")
    if not os.path.isdir(parent):
        raise OutputError(f"--json {path}: the folder {parent} does not exist")
    if os.path.lexists(path) and not (os.path.isfile(path) and _is_check_report(path)):
        raise OutputError(f"--json {path} exists and is not a report of ringgpt check: ringgpt does not replace it; "
                          "remove it or choose another name")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"--json {path}: the folder {parent} is not writable: choose another place")
