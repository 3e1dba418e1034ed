"""What every ringgpt command line shares: one line per error, the exit codes, --debug, and option checks.

Exit codes: 0 ok; 1 a failed device run or an internal fault; 2 bad input (options, prompt, model, files);
3 the appliance's result is outside its accuracy bound (`generate`'s check, `check`); 130 interrupted (Ctrl-C).
Errors are printed as one line on stderr ("error: what, where, what to do"); --debug (or RINGGPT_DEBUG=1) lets
them through with their traceback. This module imports only click, so `--help` and option errors stay fast.
"""
from __future__ import annotations

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
DEBUG_ENV = "RINGGPT_DEBUG"
EXIT_STATUS_HELP = (f"Exit status: 0 ok; {EXIT_USER_ERROR} bad input; {EXIT_FAULT} a failed device run or an internal "
                    f"fault; {EXIT_INTERRUPTED} interrupted. Errors are one line; --debug shows the traceback.")

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


def report(exc: BaseException) -> int:
    """Prints `exc` as one line on stderr and returns the exit code for it."""
    if isinstance(exc, RingGPTError):
        click.echo(f"{exc.label}: {_one_line(exc)}", err=True)
        return exc.exit_code
    if isinstance(exc, (KeyboardInterrupt, click.exceptions.Abort)):
        click.echo("interrupted", err=True)
        return EXIT_INTERRUPTED
    if isinstance(exc, OSError):
        click.echo(f"error: {_one_line(exc)}", err=True)
        return EXIT_FAULT
    click.echo(f"internal error: {type(exc).__name__}: {_one_line(exc)} (a fault in ringgpt, not in your input: "
               "rerun with --debug for the traceback and report it)", err=True)
    return EXIT_FAULT


class _Guarded:
    """Mixed into click commands: runs them in standalone mode with ringgpt's error handling."""

    def invoke(self, ctx: click.Context):
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _show_warning
                return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort, BrokenPipeError):
            raise
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - every error becomes one line and a code
            if debugging():
                raise
            sys.exit(report(exc))

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


def check_writable_file(path: str, what: str) -> None:
    """Raises OutputError unless `path` can be written as a file (its folder exists and is writable; it is not
    a folder)."""
    from ringgpt.host.errors import OutputError

    if os.path.isdir(path):
        raise OutputError(f"{what} {path} is a folder: give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise OutputError(f"{what} {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise OutputError(f"{what} {path} is not writable")
