"""Reading shell text, the one place in procpilot that knows its syntax.

``/bin/sh`` decides what a command line runs; everything procpilot says about one before it
runs is read here, the way ``sh`` and ``bash`` would read it: ``lexer`` (words with their quoting
and expansions, operators, redirections, here-documents, substitutions), ``analysis`` (the
commands a line runs, assignments that would run code; ``commands_in``: each program with its
arguments, and ``control_flow_in``: whether it runs commands under ``if``/``while``/..., for the
script preflight), ``wrappers`` (programs that run other
programs: ``env``, ``sh -c``, ``xargs``, ``find -exec``, ``timeout``...), ``first`` (the first
simple command's program, in one fast pass, for the spawn's not-found check), ``reading``
(``ShellText``: one call's command line, lexed once and read through it by the preflight, the
policy, the pre-check and the session's name).

It imports nothing of procpilot but the error tree: the engine (the spawn's pre-check), the
policy (allowlists, ``policy/commands.py``) and ``render`` (names) all read shell through it.
"""

from procpilot.shell.analysis import commands_in, control_flow_in
from procpilot.shell.variables import sensitive_variable

__all__ = ["commands_in", "control_flow_in", "sensitive_variable"]
