"""Command allowlists and denylists, matched on the programs a command line would really run.

An agent's policy may name the programs it may run (an allowlist) or must not run (a denylist). A
shell command line hides programs in many places: after ``;`` ``&&`` ``|`` ``&`` or a newline, in
``$(...)`` and backticks, behind wrappers (``env``, ``sh -c``, ``xargs``, ``find -exec``, ``timeout``
...), behind quoting (``"r"m``, ``r\\m``) and behind paths (``/bin/rm``, a copy in ``/tmp``). So this
module reads the text the way ``sh`` and ``bash`` would (a small lexer for POSIX sh plus the
bash-isms agents write), finds every command word, unwraps the wrappers, and resolves each program
to the real path of the file that would run (PATH lookup, then every symlink followed). A program
is allowed iff its real path is the real path of an allowlist entry: a copy of ``rm`` named ``ls``
is refused, a symlink to ``/usr/bin/ls`` is allowed.

Where ``sh`` (dash) and ``bash`` read a line differently (``&>``, ``[[ a || b ]]``, ``$'...'``) the
reading that finds more commands wins. What cannot be known before the line runs (a command word
built from a variable, ``eval``, ``source``, a command substitution, a function definition...) is
refused under an allowlist as :class:`UnanalyzableCommand`: when we cannot know what will run,
refusing is the only safe answer. Refusals name what was refused and why, so an agent can rewrite.

An allowlist is not a sandbox. An allowed program that runs other programs runs them unchecked:
allowing a shell (to read a script or stdin), an interpreter (python, node, perl, awk...) or a tool
with its own command hooks (git aliases and hooks, make, npm scripts, vim, less...) allows
everything. Programs that take a command as an argument are unwrapped only for the wrappers listed
in ``wrappers.WRAPPERS``; any other (ssh, su, script, unshare, chroot, parallel...) must itself be allowed,
and allowing it allows what it runs. Use isolation (read-only root, no network, a separate user) to
limit what programs can do; use the allowlist to keep an agent to the tools it was meant to use.

The package's modules, in the order a command goes through them: ``lexer`` (words, operators,
substitutions), ``analysis`` (the commands a line runs), ``wrappers`` (programs that run other
programs) and ``policy`` (the allow and deny lists, on resolved paths).
"""

from procpilot.engine.environment import sensitive_variable
from procpilot.errors import CommandDenied, UnanalyzableCommand
from procpilot.policy.shell.policy import CommandPolicy, programs_in

__all__ = ["CommandDenied", "CommandPolicy", "UnanalyzableCommand", "programs_in", "sensitive_variable"]
