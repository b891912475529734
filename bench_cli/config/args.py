"""The one command-line parser of every subcommand: options, positional names, Hydra overrides and
Hydra's own flags.

Every subcommand declares its options as ``{"--name": arity}``: ``False`` for a flag, ``True`` for
one value (``--out DIR`` or ``--out=DIR``), ``"+"`` for one or more values (``--seq-lens 1024
4096``), or a tuple of choices for an optional value taken only when the next argument is one of
them (``--cfg [job|hydra|all]``). Anything with ``=`` that does not start with ``-`` is a Hydra
override, anything else positional (or an override too, for commands that take no positional
names: ``~key`` deletes a key). Commands that hand flags on to Hydra (``run``, ``sweep``) accept
Hydra's flags as Hydra's own argument parser declares them, collected apart in ``Parsed.hydra``.
Unknown options, a missing value and a value given to a flag are one-line UserErrors that list the
valid options.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from bench_cli.core.errors import UserError, did_you_mean

Arity = bool | str | tuple  # False: flag, True: one value, "+": one or more, tuple: optional value from choices


class HelpRequested(Exception):
    """``-h``/``--help`` given to a command that has no usage text of its own: the dispatcher prints
    the command's lines of the main usage and its options, and exits 0."""

    def __init__(self, command: str, options: dict[str, Arity]):
        super().__init__(command)
        self.command, self.options = command, options


@dataclass
class Parsed:
    positional: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    options: dict[str, str | bool | list[str]] = field(default_factory=dict)  # "--records" -> "path", "--force" -> True
    hydra: dict[str, str | bool] = field(default_factory=dict)  # Hydra's flags given: "--cfg" -> "job"
    hydra_args: list[str] = field(default_factory=list)  # the same, as typed, to hand on to Hydra

    def get(self, name: str, default=None):
        return self.options.get(name, default)


@functools.lru_cache(maxsize=1)
def hydra_flags() -> dict[str, Arity]:
    """Hydra's command-line flags and their arity, read from Hydra's own argument parser
    (hydra/_internal/utils.py get_args_parser), so the list cannot fall behind Hydra's."""
    from bench_cli.config.hydra_private import hydra_flag_actions

    flags: dict[str, Arity] = {}
    for action in hydra_flag_actions():
        arity: Arity = False if action.nargs == 0 else tuple(action.choices or ()) if action.nargs == "?" else True
        flags.update({name: arity for name in action.option_strings})
    return flags


def parse(command: str, args: list[str], options: dict[str, Arity], free_options: bool = False,
          hydra: bool = False, positional: bool = True) -> Parsed:
    """Split ``args`` of ``attnbench <command>``. ``options`` maps each option (with its aliases as
    separate keys) to its arity (module docstring). With ``free_options`` any ``--name[=value]`` is
    accepted (checked later by the callee); with ``hydra`` Hydra's flags are accepted (the
    command's own options win a name they share); without ``positional`` every argument that is
    not an option is an override (Hydra's grammar then judges it)."""
    if not hydra and any(a in ("-h", "--help") for a in args) and not {"-h", "--help"} & set(options):
        raise HelpRequested(command, options)
    out, i = Parsed(), 0
    known = options  # with Hydra's flags once an option is met: reading them imports Hydra (half a second)
    while i < len(args):
        a = args[i]
        if a.startswith("-") and a != "-":
            known = {**(hydra_flags() if hydra else {}), **options}
            name, eq, value = a.partition("=")
            if name not in known and not free_options:
                raise UserError(f"unknown option '{name}' for `attnbench {command}`{did_you_mean(name, known)}; "
                                f"valid: {_valid(options, hydra)}")
            arity = known.get(name, bool(eq))
            taken = _option_value(command, name, arity, eq, value, args[i + 1:])
            typed = args[i:i + 1 + (0 if eq else len(taken))]  # the option and the values that follow it
            parsed = (taken if arity == "+" else taken[0]) if taken else True
            if name in options or name not in known:
                out.options[name] = parsed
            else:
                out.hydra[name] = parsed
                out.hydra_args += typed
            i += len(typed) - 1
        elif "=" in a or not positional:
            out.overrides.append(a)
        else:
            out.positional.append(a)
        i += 1
    return out


def _option_value(command: str, name: str, arity: Arity, eq: str, value: str, rest: list[str]) -> list[str]:
    """The values of option ``name`` (``[]`` for a flag): from ``--name=value`` or the arguments
    that follow it (``rest``)."""
    if arity is False:
        if eq:
            raise UserError(f"option {name} of `attnbench {command}` takes no value (got '{value}')")
        return []
    if eq:
        return [value]
    if isinstance(arity, tuple):
        return rest[:1] if rest and rest[0] in arity else []
    values = []
    for r in rest:  # one value, or (arity "+") every value up to the next option or override
        if (r.startswith("-") and not _is_number(r)) or (values and arity != "+") or (arity == "+" and "=" in r):
            break
        values.append(r)
    if not values:
        raise UserError(f"option {name} of `attnbench {command}` needs a value")
    return values


def _is_number(text: str) -> bool:
    """A negative number given as a value (``--seq-lens -1``), not an option: its range is the
    option's to judge."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def _valid(options: dict[str, Arity], hydra: bool) -> str:
    names = ", ".join(sorted(options))
    if hydra:
        return (names + ", and " if names else "") + "Hydra's flags (--cfg job, --info, --help, ...)"
    return names or "none"
