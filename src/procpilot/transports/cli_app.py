"""The ``procpilot`` command line: every command (its entry point, kept light, is cli.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from procpilot.config import load_settings
from procpilot.errors import ProcpilotError, StateDirDamaged

if TYPE_CHECKING:
    from procpilot.client import Client, ToolReply
    from procpilot.config import Settings
    from procpilot.transports.serve import DaemonAddress

app = typer.Typer(add_completion=False, no_args_is_help=True, help="A process supervisor for AI agents.")
_err = Console(stderr=True)


def _print_version(wanted: bool) -> None:
    if wanted:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("procpilot")
        except PackageNotFoundError:  # run from a checkout that was never installed
            number = "unknown (not installed)"
        print(f"procpilot {number}")
        raise typer.Exit


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.", callback=_print_version, is_eager=True)
    ] = False,
) -> None:
    """procpilot: run commands for agents, inside limits, with nothing lost and nothing left behind."""


_WorkspaceOption = Annotated[
    Path | None,
    typer.Option(help="The agents' workspace: default working directory and the bound of every workdir."),
]


def _workspace(path: Path | None) -> dict[str, Any]:
    """The settings override for ``--workspace`` (none when it was not given)."""
    return {} if path is None else {"workspace_root": path.expanduser().absolute()}


_ToolNamesOption = Annotated[
    str | None, typer.Option("--tool-names", help="dotted (process.run) or underscore (process_run, for OpenAI).")
]
_ToolsOption = Annotated[
    str | None,
    typer.Option(
        "--tools", help="Serve these, comma-separated: exec,process,process.* or names (mcp's default: exec,process)."
    ),
]


_ProfileOption = Annotated[
    str | None,
    typer.Option(
        "--profile",
        help="openclaw: exec/process answer as OpenClaw's do; codex / claude: Codex CLI's or Claude Code's "
        "shell tools in their place ([tools.exec] profile).",
    ),
]


def _tool_choice(names: str | None, tools: str | None, profile: str | None = None) -> dict[str, Any]:
    """The settings overrides for ``--tool-names``, ``--tools`` and ``--profile``."""
    chosen: dict[str, Any] = {} if names is None else {"tool_names": names}
    if tools is not None:
        chosen["served_tools"] = tuple(name.strip() for name in tools.split(",") if name.strip())
    if profile is not None:
        chosen["exec"] = {"profile": profile}
    return chosen


@app.command()
def mcp(
    agent: Annotated[str, typer.Option(help="The scope this server's sessions belong to.")] = "default",
    config: Annotated[Path | None, typer.Option(help="A TOML configuration file.")] = None,
    http: Annotated[bool, typer.Option(help="Serve streamable HTTP instead of stdio.")] = False,
    host: Annotated[str, typer.Option(help="HTTP bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port (0 = any free port).")] = 0,
    workspace: _WorkspaceOption = None,
    tool_names: _ToolNamesOption = None,
    tools: _ToolsOption = None,
    profile: _ProfileOption = None,
    keep_sessions: Annotated[
        bool,
        typer.Option(help="When the client goes, leave running sessions to the next server of this agent."),
    ] = False,
) -> None:
    """Serve the tools to an MCP client over stdio (default) or streamable HTTP."""
    try:
        settings = load_settings(config, **_workspace(workspace), **_tool_choice(tool_names, tools, profile))
    except ProcpilotError as exc:
        _refuse_handshake(exc)
        _fail(exc, 2)
    if http:
        from procpilot.transports.serve import check_binding

        # The same rule as `serve`: off the loopback, exec without a bearer token is a remote shell.
        settings = settings.model_copy(update={"server": settings.server.model_copy(update={"host": host})})
        try:
            check_binding(settings.server)
        except ProcpilotError as exc:
            _fail(exc, 2)

    def announce(url: str) -> None:
        scope_note = "agent scope: by bearer token" if settings.server.tokens else f"agent scope: {agent}"
        _err.print(f"procpilot MCP server on [bold]{url}[/bold] ({scope_note})")
        _err.print(f"Connect a client, e.g.: claude mcp add --transport http procpilot {url}")
        _err.print(f"state: {settings.state_dir}   workspace: {settings.workspace_root}")

    from procpilot.transports.mcp_serve import serve_mcp

    serving = serve_mcp(
        settings, agent=agent, keep_sessions=keep_sessions, http_port=port if http else None, announce=announce
    )
    try:
        asyncio.run(serving)
    except ProcpilotError as exc:  # a refused binding, a tool set that names no tool...
        _refuse_handshake(exc)
        _fail(exc, _refused(exc))


def _refuse_handshake(exc: ProcpilotError) -> None:
    """The requests the handshake's front read before this server gave up get ``exc`` as their
    error (the front may have answered ``initialize`` already: transports/mcp_handshake.py)."""
    from procpilot.transports.mcp_handshake import refuse

    refuse(exc.to_dict())


# -- the daemon and its client commands (procpilot serve, run, ps, logs, write, kill, wait, rm) --

_out = Console()
_UrlOption = Annotated[
    str | None,
    typer.Option("--url", envvar="PROCPILOT_URL", help="The daemon: http://HOST:PORT or unix:///PATH."),
]
_TokenOption = Annotated[
    str | None,
    typer.Option("--token", envvar="PROCPILOT_TOKEN", help="Your agent's bearer token.", show_default=False),
]


@app.command()
def serve(
    config: Annotated[Path | None, typer.Option(help="A TOML configuration file.")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="TCP port (default 8765; 0 = any free port).")] = None,
    unix_socket: Annotated[Path | None, typer.Option(help="Also listen on this Unix socket (mode 0600).")] = None,
    tcp: Annotated[bool, typer.Option(help="Listen on TCP (--no-tcp: the Unix socket only).")] = True,
    state_dir: Annotated[Path | None, typer.Option(help="Where session logs and records go.")] = None,
    workspace: _WorkspaceOption = None,
    tool_names: _ToolNamesOption = None,
    tools: _ToolsOption = None,
    profile: _ProfileOption = None,
    agent: Annotated[str, typer.Option(help="Every caller's agent when no tokens are configured.")] = "default",
    takeover: Annotated[
        bool, typer.Option(help="Take every running session over from the daemon already on this state dir.")
    ] = False,
    keep_sessions: Annotated[
        bool,
        typer.Option(
            help="On SIGTERM/SIGINT leave running sessions to the next server (SIGUSR2 always does; SIGHUP"
            " does and re-execs the daemon in place)."
        ),
    ] = False,
) -> None:
    """Run the daemon: REST, WebSocket, server-sent events and MCP for many agents, one supervisor."""
    from procpilot.transports.serve import serve as run_daemon

    overrides: dict[str, Any] = {}
    server: dict[str, Any] = {}
    if host is not None:
        server["host"] = host
    if port is not None:
        server["port"] = port
    if unix_socket is not None:
        server["unix_socket"] = unix_socket.expanduser().absolute()
    if server:
        overrides["server"] = server
    if state_dir is not None:
        overrides["state_dir"] = state_dir

    def settings_now() -> Settings:
        return load_settings(
            config, None, **overrides, **_workspace(workspace), **_tool_choice(tool_names, tools, profile)
        )

    try:
        settings = settings_now()
    except ProcpilotError as exc:
        _fail(exc, 2)

    def announce(address: DaemonAddress) -> None:
        say = functools.partial(_err.print, soft_wrap=True)  # one line each: scripts read them
        if address.url:
            say(f"procpilot daemon on [bold]{address.url}[/bold]")
            say(f"  REST {address.url}/v1/tools/NAME   OpenAPI {address.url}/openapi.json")
            say(f"  MCP  {address.url}/mcp   events {address.url}/v1/events   WebSocket {address.url}/v1/proc")
            say(f"  console {address.url}/console/   (a web page: sessions, output, approvals, audit)")
        if address.unix_socket:
            say(f"procpilot daemon on unix socket [bold]{address.unix_socket}[/bold]")
        tokens = len(settings.server.tokens)
        say(
            f"  auth: {tokens} bearer token(s)"
            if tokens
            else f"  auth: none configured: every caller is agent {agent!r} (loopback only)"
        )
        say(f"  state: {settings.state_dir}   workspace: {settings.workspace_root}")
        for line in _how_to_connect(address, settings):
            say(line)

    try:
        asyncio.run(
            run_daemon(
                settings,
                open_agent=agent,
                tcp=tcp,
                announce=announce,
                keep_sessions=keep_sessions,
                takeover=takeover,
                recheck=settings_now,  # before a SIGHUP re-exec: the new image must be able to start
            )
        )
    except ProcpilotError as exc:
        _fail(exc, _refused(exc))


# A damaged state directory: not 2 (a setting to change) but its own code, so that a service
# manager can be told not to restart into the same damage (systemd: RestartPreventExitStatus=3).
EXIT_STATE_DIR_DAMAGED = 3


def _refused(exc: ProcpilotError) -> int:
    """The exit code of a server that will not start (or serve on) for ``exc``."""
    return EXIT_STATE_DIR_DAMAGED if isinstance(exc, StateDirDamaged) else 2


def _how_to_connect(address: DaemonAddress, settings: Settings) -> list[str]:
    """Copy-paste lines for an MCP client and for the CLI in another shell (never a token)."""
    import shlex

    from procpilot.config import load_settings as defaults

    tokens = bool(settings.server.tokens)
    lines = ["Connect:"]
    if address.url:
        header = ' --header "Authorization: Bearer $PROCPILOT_TOKEN"' if tokens else ""
        lines.append(f"  MCP client:  claude mcp add --transport http procpilot {address.url}/mcp{header}")
    exports = [f"export PROCPILOT_URL={shlex.quote(address.client_url)}"]
    if tokens:
        exports.append("export PROCPILOT_TOKEN=<your agent's token>")
    # The CLI also finds a daemon through its daemon.json, but only in the state dir it looks in.
    env = {k: v for k, v in os.environ.items() if k != "PROCPILOT_STATE_DIR"}
    with contextlib.suppress(ProcpilotError):
        if settings.state_dir != defaults(env=env).state_dir:
            exports.append(f"export PROCPILOT_STATE_DIR={shlex.quote(str(settings.state_dir))}")
    lines.append("  CLI:         " + exports[0])
    lines += [" " * 15 + line for line in exports[1:]]
    return lines


# Hints written for agents name tool calls; at a terminal the same advice is a CLI verb.
_CLI_HINTS = {
    "see_your_sessions": "`procpilot ps` lists your sessions and their ids.",
    "check_status": "`procpilot logs ID` shows its output; `procpilot wait ID` its exit code.",
    "kill_first": "`procpilot kill ID` first, or `procpilot rm ID`, which kills and then removes it.",
    "force_kill": "`procpilot kill ID --signal SIGKILL`.",
    "start_again": "Stdin was closed; start a new session (`procpilot run`) to send more input.",
    "fix_arguments": "`procpilot COMMAND --help` lists the options.",
    "be_specific": "Give more of the id, or the session's name (`procpilot ps` lists both).",
    "pick_another": "Choose another --name, or `procpilot kill NAME` the session that holds it.",
}


def _fail(exc: ProcpilotError, code: int = 1) -> NoReturn:
    _err.print(f"[red]{exc.code}[/red]: {escape(exc.message)}")
    for key, text in exc.hints.items():
        _err.print(f"  - {escape(_CLI_HINTS.get(key, text))}")
    raise typer.Exit(code)


@contextlib.contextmanager
def _client(url: str | None, token: str | None) -> Iterator[Client]:
    from procpilot.client import Client

    try:
        client = Client(url, token)  # a malformed PROCPILOT_CHAT is refused here, typed
    except ProcpilotError as exc:
        _fail(exc)
    try:
        yield client
    except ProcpilotError as exc:
        _fail(exc)
    finally:
        client.close()


def _exit_code(data: dict[str, object]) -> int:
    """The command's exit code as a shell would report it (128+N for signal N, 124 timed out)."""
    code = data.get("exitCode")
    if isinstance(code, int):
        return code
    if data.get("state") == "timed_out":
        return 124
    name = data.get("exitSignal")
    if isinstance(name, str):
        with contextlib.suppress(KeyError):
            return 128 + int(signal.Signals[name if name.startswith("SIG") else "SIG" + name])
    return 0 if data.get("status") == "done" else 1


_RUNNING = ("running", "queued")
_WAIT_CALL_S = 600.0
# Words after the command are its own (`run ls -la`); an unknown option before it is a typo of ours
# (`--timout 5`), refused with a suggestion. A command that starts with "-" follows "--".
_PASSTHROUGH = {"allow_interspersed_args": False}


@app.command(context_settings=_PASSTHROUGH)
def run(
    command: Annotated[list[str], typer.Argument(help="The command (one shell string, or words to quote).")],
    detach: Annotated[bool, typer.Option("-d", "--detach", help="Start in the background; print the id.")] = False,
    workdir: Annotated[str | None, typer.Option(help="Working directory (default: the workspace).")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="NAME=VALUE, repeatable.")] = None,
    timeout: Annotated[int | None, typer.Option(help="Seconds before the tree is ended (0 = none).")] = None,
    pty: Annotated[bool, typer.Option(help="Run under a pseudo-terminal.")] = False,
    name: Annotated[
        str | None, typer.Option("--name", "-n", help="Name the session; every verb takes it in place of the id.")
    ] = None,
    restart: Annotated[
        str | None, typer.Option(help="no, on-failure or always: start it again when it ends (with backoff).")
    ] = None,
    max_restarts: Annotated[int | None, typer.Option(help="Stop restarting after this many restarts.", min=0)] = None,
    url: _UrlOption = None,
    token: _TokenOption = None,
) -> None:
    """Run a command on the daemon; its output streams here and its exit code is ours."""
    import shlex

    text = command[0] if len(command) == 1 else shlex.join(command)
    variables = {}
    for item in env or []:
        name, sep, value = item.partition("=")
        if not sep:
            _fail(ProcpilotError(f"--env wants NAME=VALUE, not {item!r}"), 2)
        variables[name] = value
    with _client(url, token) as client:
        started = client.exec(
            text,
            background=True,
            workdir=workdir,
            env=variables or None,
            timeout=timeout,
            pty=pty or None,
            name=name,
            restart=restart,
            maxRestarts=max_restarts,
        )
        session_id = started["sessionId"]
        if detach:
            print(session_id)
            _err.print(f"started in the background; follow it with: procpilot logs -f {name or session_id}")
            return
        _forward_stdin(client.url, token, session_id)
        data = started.data
        copier = _Copier(client, session_id)
        with _signals_raise(_FORWARDED_SIGNALS):
            try:
                while data.get("status") in _RUNNING:
                    data = copier.step()
            except (KeyboardInterrupt, _Signalled) as exc:
                # What would have ended a local command ends the remote one the same way.
                sig = exc.signum if isinstance(exc, _Signalled) else signal.SIGINT
                client.process("kill", session_id, signal=signal.Signals(sig).name)
                data = copier.step()
                while data.get("status") in _RUNNING:
                    data = copier.step()
    raise typer.Exit(_exit_code(data))


class _Copier:
    """Copies a session's stdout and stderr here, every byte of each, in order per stream.

    It reads the log files by byte offset (``process.logs``), so nothing is ever cut: a poll's
    result is cut to what a model should read, and ``run make | tee build.log`` needs all of it.
    A daemon that serves no ``process.*`` tools gets the polls (and their cut notes) instead.
    """

    def __init__(self, client: Client, session_id: str) -> None:
        self.client = client
        self.session_id = session_id
        self.offsets = {"stdout": 0, "stderr": 0}
        self.by_offset = True

    def step(self) -> dict[str, object]:
        """Wait (up to 30 s) for new output or the exit, copy what arrived; the session's state."""
        if not self.by_offset:
            return _stream_poll(self.client, self.session_id)
        # limit=0: the poll only waits; the output itself comes from the files.
        reply = self.client.process("poll", self.session_id, stream="combined", timeout=30_000, limit=0)
        for stream in ("stdout", "stderr"):
            if not self._copy(stream):
                return _stream_poll(self.client, self.session_id)
        return reply.data

    def _copy(self, stream: str) -> bool:
        """Copy ``stream`` up to its end now; False when the daemon serves no process.logs."""
        from procpilot.errors import ProcpilotError as Refused

        out = sys.stdout if stream == "stdout" else sys.stderr
        while True:
            try:
                page = self.client.call(
                    "process.logs", process_id=self.session_id, stream=stream, offset=self.offsets[stream]
                )
            except Refused as exc:
                if exc.code != "UnknownTool":
                    raise
                self.by_offset = False
                return False
            text = str(page.get(stream) or "")
            end = page.get(f"{stream}_next_offset")
            size = int(page.get(f"{stream}_size") or 0)
            if text:
                out.write(text)
                out.flush()
            if not isinstance(end, int) or end <= self.offsets[stream]:
                return True
            self.offsets[stream] = end
            if end >= size:
                return True


_FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class _Signalled(BaseException):  # like KeyboardInterrupt: no `except Exception` may swallow it
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_raise(signals: tuple[signal.Signals, ...]) -> Iterator[None]:
    """Turn ``signals`` into ``_Signalled`` once, as Python does SIGINT into KeyboardInterrupt;
    a second one of them has its default effect (the user insists)."""

    def handler(signum: int, _frame: object) -> None:
        for sig in signals:
            signal.signal(sig, signal.SIG_DFL)
        raise _Signalled(signum)

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _forward_stdin(url: str, token: str | None, session_id: str) -> None:
    """Piped or redirected stdin goes to the session's stdin, then EOF (``echo hi | procpilot run cat``).

    A terminal is left alone: there a line-by-line echo would fight the shell's own, and a
    session that wants interactive input is better served by ``procpilot write``.
    """
    import codecs

    if sys.stdin is None or sys.stdin.isatty():
        return
    try:
        fd = sys.stdin.fileno()
    except (OSError, ValueError):
        return

    def pump() -> None:
        from procpilot.client import Client

        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        # Its own connection: the main thread's is busy in a long poll. The session ending first
        # (StdinClosed, ProcessAlreadyExited) just ends the pumping.
        with contextlib.suppress(ProcpilotError, OSError), Client(url, token) as writer:
            while True:
                chunk = os.read(fd, 1 << 16)
                text = decoder.decode(chunk, final=not chunk)
                if text or not chunk:
                    writer.process("write", session_id, data=text or None, eof=True if not chunk else None)
                if not chunk:
                    return

    # A daemon thread: a stdin that never closes must not keep us alive once the session ended.
    thread = threading.Thread(target=pump, name="procpilot-stdin", daemon=True)
    _STDIN_PUMPS.append(thread)
    thread.start()


# The stdin pumps started by this process; main() never lets the interpreter finalize under one.
_STDIN_PUMPS: list[threading.Thread] = []


def _stream_poll(client: Client, session_id: str) -> dict[str, object]:
    """Print what arrived, stdout to our stdout and stderr to our stderr; the stdout poll waits
    (up to 30 s) for output on either stream, or the exit."""
    reply = _poll_one(client, session_id, "stdout", 30_000)
    _poll_one(client, session_id, "stderr", None)  # after stdout's, so a finished session's is complete
    return reply.data


def _poll_one(client: Client, session_id: str, stream: str, timeout: int | None) -> ToolReply:
    reply = client.process("poll", session_id, stream=stream, timeout=timeout, limit=200_000)
    if reply.get("cutChars"):
        note = escape(f"[{reply['cutChars']} characters of {stream} not shown: procpilot logs {session_id}]")
        _err.print(f"[dim]{note}[/dim]")
    output = reply.get("output") or ""
    if output:
        out = sys.stdout if stream == "stdout" else sys.stderr
        out.write(output)
        out.flush()
    return reply


@app.command()
def ps(
    json_: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    running: Annotated[bool, typer.Option("--running", help="Only sessions still running (or queued).")] = False,
    agent: Annotated[
        str | None, typer.Option("--agent", help="Another agent's sessions, or '*' for all (approvers only).")
    ] = None,
    url: _UrlOption = None,
    token: _TokenOption = None,
) -> None:
    """List your sessions on the daemon: id, name, pid, status, age, CPU, memory, waiting for input."""
    import time

    from rich.table import Table

    with _client(url, token) as client:
        listed = client.sessions(agent) if agent else client.process("list")["sessions"]
    rows = [row for row in listed if not running or row.get("status") in _RUNNING]
    if json_:
        print(json.dumps(rows, indent=2))
        return
    # Fits 80 columns: one line a session, ids cut to the shortest prefix that still names one
    # session (every verb takes it), the command cut last with an ellipsis; --json has it all.
    ids = _short_ids([str(row["sessionId"]) for row in listed])
    extra = [
        (title, key)
        for title, key in (("INPUT", "waitingForInput"), ("RESTARTS", "restarts"))
        if any(row.get(key) for row in rows)
    ]
    titles = [*(["AGENT"] if agent else []), "ID", "NAME", "PID", "STATUS", "AGE", "CPU", "MEM"]
    titles += [title for title, _ in extra]
    now = time.time()
    cells = []
    for row in rows:
        code = row.get("exitCode")
        started = row.get("startedAt")
        optional = {
            "waitingForInput": "waiting" if row.get("waitingForInput") else "",
            "restarts": str(row.get("restarts") or ""),
        }
        cells.append(
            [
                *([escape(str(row.get("agent", ""))[:12])] if agent else []),
                ids[str(row["sessionId"])],
                escape(str(row.get("sessionName") or "")[:12]),
                str(row.get("pid") or ""),
                str(row["status"]) + ("" if code is None or code == 0 else f" {code}"),
                _duration(now - started) if isinstance(started, (int, float)) else "",
                "" if row.get("cpuMs") is None else f"{int(row['cpuMs']) / 1000:.1f}s",  # None: not sampled yet
                "" if row.get("memoryBytes") is None else _size(int(row["memoryBytes"])),
                *(optional[key] for _, key in extra),
                escape(" ".join(str(row.get("command", "")).split())),
            ]
        )
    table = Table(box=None, pad_edge=False, show_edge=False)
    for i, title in enumerate(titles):
        # Every column but COMMAND keeps its full width: only the command is cut.
        table.add_column(title, no_wrap=True, min_width=max([len(title), *(len(c[i]) for c in cells)]))
    table.add_column("COMMAND", no_wrap=True, overflow="ellipsis", min_width=10)
    for line in cells:
        table.add_row(*line)
    _out.print(table if rows else "No sessions.")


def _short_ids(ids: list[str], least: int = 8) -> dict[str, str]:
    """Each id cut to its shortest prefix (``least`` characters or more) that fits no other id."""
    short = {}
    for sid in ids:
        n = least
        while n < len(sid) and any(other != sid and other.startswith(sid[:n]) for other in ids):
            n += 1
        short[sid] = sid[:n]
    return short


def _duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``, ``3d04h``: an age as ps shows it."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _size(n: int) -> str:
    """``812B``, ``4.0K``, ``118.3M``, ``2.1G``: a memory size as ps shows it."""
    value = float(n)
    for unit in ("B", "K", "M"):
        if value < 1024:
            return f"{n}B" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}G"


@app.command()
def logs(
    session_id: Annotated[str, typer.Argument(help="The session: its id, a unique prefix of it, or its name.")],
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing as it arrives.")] = False,
    stream: Annotated[str | None, typer.Option(help="stdout or stderr (default: both, in order).")] = None,
    url: _UrlOption = None,
    token: _TokenOption = None,
) -> None:
    """Print a session's output (all of it, paged by lines); -f follows until it ends."""
    import time

    page = 2000
    offset = 0
    with _client(url, token) as client:
        while True:
            reply = client.process("log", session_id, offset=offset, limit=page, stream=stream)
            count = int(reply.get("lines") or 0)
            lines = str(reply.get("output") or "").split("\n") if count else []
            total = int(reply.get("totalLines") or 0)
            running = reply.get("status") in _RUNNING
            # Following a running session, an unterminated last line may still grow: print it once
            # its newline arrives. A line that already has one is printed at once.
            complete = int(reply.get("completeLines", total))
            hold = follow and running and count > 0 and offset + count > complete
            if hold:
                lines, count = lines[:-1], count - 1
            if lines:
                sys.stdout.write("\n".join(lines) + "\n")
                sys.stdout.flush()
            offset += count if count or hold else max(0, total - offset)  # skip lines the cap dropped
            if offset < total - (1 if hold else 0):
                continue  # the next page is already there
            if not (follow and running):
                break
            time.sleep(0.3)


@app.command()
def write(
    session_id: Annotated[str, typer.Argument(help="The session: its id, a unique prefix of it, or its name.")],
    data: Annotated[str, typer.Argument(help="Text for its stdin ('-' reads our stdin).")] = "",
    eof: Annotated[bool, typer.Option(help="Close its stdin afterwards.")] = False,
    newline: Annotated[bool, typer.Option("--newline", "-n", help="Append a newline.")] = False,
    url: _UrlOption = None,
    token: _TokenOption = None,
) -> None:
    """Write to a session's stdin."""
    text = sys.stdin.read() if data == "-" else data
    if newline:
        text += "\n"
    with _client(url, token) as client:
        reply = client.process("write", session_id, data=text, eof=eof or None)
    _err.print(escape(reply.text))


@app.command()
def kill(
    session_id: Annotated[str, typer.Argument(help="The session: its id, a unique prefix of it, or its name.")],
    signal_: Annotated[str, typer.Option("--signal", "-s", help="First signal (SIGKILL follows).")] = "SIGTERM",
    url: _UrlOption = None,
    token: _TokenOption = None,
) -> None:
    """End a session's whole process tree."""
    with _client(url, token) as client:
        reply = client.process("kill", session_id, signal=_signal_name(signal_))
    _err.print(escape(reply.text))


def _signal_name(given: str) -> str:
    """``9``, ``KILL`` or ``SIGKILL`` as the tools name it (``SIGKILL``); anything else is left
    for the tool to refuse with its list of signals."""
    text = given.strip().upper()
    if text.isdigit():
        try:
            return signal.Signals(int(text)).name
        except ValueError:
            _fail(ProcpilotError(f"no signal numbered {given}", hints={"signals": "e.g. 15 (SIGTERM), 9 (SIGKILL)"}), 2)
    return text if text.startswith("SIG") else "SIG" + text


@app.command()
def stop(
    session_id: Annotated[str, typer.Argument(help="The session: its id, a unique prefix of it, or its name.")],
    url: _UrlOption = None,
    token: _TokenOption = None,
) -> None:
    """Stop a session (SIGTERM to its tree, SIGKILL after the grace period); it stays listed, as in pm2."""
    with _client(url, token) as client:
        reply = client.process("kill", session_id)
        client.process("wait", session_id, timeout=int(_WAIT_CALL_S * 1000))
    _err.print(escape(reply.text))


@app.command()
def restart(
    session_id: Annotated[str, typer.Argument(help="The session: its id, a unique prefix of it, or its name.")],
    url: _UrlOption = None,
    token: _TokenOption = None,
) -> None:
    """Stop a session if it runs, then start its command again in the background: same command,
    working directory, name and restart policy, a new session id (printed)."""
    with _client(url, token) as client:
        rows = client.process("list")["sessions"]
        row = _one_session(rows, session_id)
        if row.get("status") in _RUNNING:
            client.process("kill", row["sessionId"])
            client.process("wait", row["sessionId"], timeout=int(_WAIT_CALL_S * 1000))
        started = client.exec(
            str(row["command"]),
            background=True,
            workdir=row.get("cwd") or None,
            name=row.get("sessionName") or None,
        )
    print(started["sessionId"])
    _err.print(f"restarted {escape(str(row['command']))} as {started['sessionId']}")


def _one_session(rows: list[dict[str, Any]], wanted: str) -> dict[str, Any]:
    """The row ``wanted`` names as the tools resolve it: its id, a unique id prefix, or its name
    (the live session of that name, else the newest)."""
    from procpilot.errors import AmbiguousSession, SessionNotFound

    exact = [r for r in rows if r["sessionId"] == wanted]
    if exact:
        return exact[0]
    named = [r for r in rows if r.get("sessionName") == wanted]
    if named:
        live = [r for r in named if r.get("status") in _RUNNING]
        return (live or named)[0]
    prefixed = [r for r in rows if str(r["sessionId"]).startswith(wanted)]
    if len(prefixed) == 1:
        return prefixed[0]
    if prefixed:
        _fail(AmbiguousSession(f"{wanted!r} fits {len(prefixed)} sessions; give more of the id"), 1)
    _fail(SessionNotFound(f"no session {wanted!r}"), 1)


@app.command()
def wait(
    session_id: Annotated[str, typer.Argument(help="The session: its id, a unique prefix of it, or its name.")],
    pattern: Annotated[str | None, typer.Option(help="Return when the output matches this regex.")] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Seconds to wait at most (default: until it ends).", min=0)
    ] = None,
    url: _UrlOption = None,
    token: _TokenOption = None,
) -> None:
    """Block until a session ends (or its output matches): exit code = the command's; 124 on timeout."""
    import time

    deadline = None if timeout is None else time.monotonic() + timeout
    with _client(url, token) as client, _err.status(f"waiting for session {session_id}…", spinner="dots"):
        while True:
            # One wait call holds at most _WAIT_CALL_S (the tool's own cap): longer waits are several.
            left = _WAIT_CALL_S if deadline is None else max(0.0, deadline - time.monotonic())
            reply = client.process("wait", session_id, pattern=pattern, timeout=int(min(left, _WAIT_CALL_S) * 1000))
            if reply.get("reason") != "timeout" or (deadline is not None and time.monotonic() >= deadline):
                break
    print(reply.text)
    reason = reply.get("reason")
    if reason == "timeout":
        raise typer.Exit(124)
    raise typer.Exit(0 if reason == "pattern" else _exit_code(reply.data))


@app.command()
def rm(
    session_id: Annotated[str, typer.Argument(help="The session: its id, a unique prefix of it, or its name.")],
    url: _UrlOption = None,
    token: _TokenOption = None,
) -> None:
    """Remove a session (killing it first if it still runs) and its logs."""
    with _client(url, token) as client:
        reply = client.process("remove", session_id)
    _err.print(escape(reply.text))


@app.command()
def tools(
    format_: Annotated[
        str | None,
        typer.Option(
            "--format", help="Print this build's tool definitions as JSON: mcp, openai or anthropic (no daemon)."
        ),
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the daemon's tools as JSON (with schemas).")] = False,
    config: Annotated[Path | None, typer.Option(help="A TOML configuration file (with --format).")] = None,
    url: _UrlOption = None,
    token: _TokenOption = None,
) -> None:
    """List the tools the daemon serves (REST POST /v1/tools/NAME, MCP tools/call), or --format them."""
    if format_ is not None:
        from procpilot.faces.all_tools import definitions_json
        from procpilot.faces.definitions import FORMATS

        if format_ not in FORMATS:
            _fail(ProcpilotError(f"--format must be one of {', '.join(FORMATS)}, not {format_!r}"), 2)
        try:
            settings = load_settings(config)
        except ProcpilotError as exc:
            _fail(exc, 2)
        print(definitions_json(format_, settings))
        return
    from rich.table import Table

    with _client(url, token) as client:
        rows = client.tools()
    if json_:
        print(json.dumps(rows, indent=2))
        return
    table = Table("TOOL", "TIER", "DESCRIPTION", box=None)
    for row in rows:
        table.add_row(row["name"], row.get("tier", ""), escape(str(row.get("description", "")).split(". ")[0]))
    _out.print(table)


@app.command()
def approvals(
    json_: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    url: _UrlOption = None,
    token: _TokenOption = None,
) -> None:
    """Calls held for approval (for the agents listed as server approvers); decide with approve / deny."""
    import time

    from rich.table import Table

    with _client(url, token) as client:
        pending = client.approvals()
    if json_:
        print(json.dumps(pending, indent=2))
        return
    table = Table("ID", "AGENT", "TOOL", "WAITING", "CALL", box=None)
    for row in pending:
        waited = max(0.0, time.time() - float(row.get("created_at") or time.time()))
        table.add_row(row["id"], escape(row["scope"]), row["tool"], f"{waited:.0f}s", escape(str(row["summary"])))
    _out.print(table if pending else "No calls awaiting approval.")


@app.command()
def approve(
    request_id: Annotated[str, typer.Argument(help="The approval request (procpilot approvals).")],
    url: _UrlOption = None,
    token: _TokenOption = None,
) -> None:
    """Let a held call run."""
    with _client(url, token) as client:
        decided = client.decide(request_id, True)
    _err.print(f"approved {escape(decided['id'])}: {escape(decided['summary'])} (agent {escape(decided['scope'])})")


@app.command()
def deny(
    request_id: Annotated[str, typer.Argument(help="The approval request (procpilot approvals).")],
    reason: Annotated[str | None, typer.Option(help="Told to the agent with the refusal.")] = None,
    url: _UrlOption = None,
    token: _TokenOption = None,
) -> None:
    """Refuse a held call (the agent gets ApprovalDenied, with the reason)."""
    with _client(url, token) as client:
        decided = client.decide(request_id, False, reason)
    _err.print(f"denied {escape(decided['id'])}: {escape(decided['summary'])} (agent {escape(decided['scope'])})")


@app.command()
def doctor(
    json_: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    url: _UrlOption = None,
    token: _TokenOption = None,
) -> None:
    """What this host offers (tree kill, resource limits, isolation) and whether a daemon answers."""
    from procpilot.client import Client

    local = asyncio.run(_probe_capabilities())
    daemon: dict[str, Any] = {}
    try:
        client = Client(url, token)
    except ProcpilotError as exc:
        _fail(exc)
    try:
        daemon = {"url": client.url, "reachable": True, "capabilities": client.capabilities()}
    except ProcpilotError as exc:
        # A daemon that refuses our token still answered: say so, it is not "not running".
        daemon = {"url": client.url, "reachable": exc.code != "DaemonNotRunning", "error": exc.code}
        daemon["message"] = exc.message
    finally:
        client.close()
    if json_:
        print(json.dumps({"host": local, "daemon": daemon}, indent=2))
        return
    _out.print(_capabilities_table("This host (probed here)", local))
    if "capabilities" in daemon:
        _out.print(f"[green]daemon reachable[/green] at {escape(daemon['url'])}")
        caps = dict(daemon["capabilities"])
        cluster = caps.pop("cluster", None)
        _out.print(_capabilities_table("The daemon's host", caps))
        if cluster is not None:
            _out.print(_nodes_table(cluster))
    elif daemon["reachable"]:
        _out.print(f"[yellow]daemon at {escape(daemon['url'])} answered: {daemon['error']}[/yellow]")
        _out.print(f"  {escape(daemon['message'])}")
    else:
        _out.print(f"[yellow]no daemon running[/yellow] at {escape(daemon['url'])}: start one with procpilot serve")


async def _probe_capabilities() -> dict[str, Any]:
    """A supervisor started on a throw-away state dir and closed: what it found is what serve would."""
    import tempfile

    from procpilot.engine.supervisor import Supervisor, disk_space

    with tempfile.TemporaryDirectory(prefix="procpilot-doctor-") as tmp:
        try:
            settings = load_settings(None, state_dir=tmp, workspace_root=tmp)
        except ProcpilotError:  # a bad environment variable is not what doctor is asked about
            settings = load_settings(None, {}, state_dir=tmp, workspace_root=tmp)
        # Sized as a server's would be: the descriptor limit it reports is the one a daemon gets here.
        server = settings.server
        async with Supervisor(settings, descriptors_for=(server.max_running_sessions, server.max_connections)) as sup:
            found = sup.capabilities()
    # Whether sessions outlive a server is the daemon's to say (its own holder), not this probe's.
    found.pop("restarts", None)
    # The state directory a daemon started here would use, not the throw-away one probed.
    with contextlib.suppress(ProcpilotError):
        found["state_dir"] = disk_space(load_settings(None).state_dir)
    return found


def _nodes_table(cluster: Mapping[str, Any]) -> Any:
    """The daemon's cluster nodes (``[cluster] backend = "ray"``): one row per live node."""
    from rich.table import Table

    title = f"Cluster nodes ({cluster.get('backend')} at {cluster.get('address')})"
    table = Table(
        "NODE",
        "SESSIONS",
        "RESOURCES",
        "TREE KILL",
        "LIMITS",
        "ISOLATION",
        box=None,
        title=escape(title),
        title_justify="left",
    )
    for node in cluster.get("nodes", []):
        resources = ", ".join(f"{k}={v:g}" for k, v in sorted(node["resources"].items()) if "memory" not in k)
        isolation = ", ".join(k for k, v in (node.get("isolation") or {}).items() if v) or "none"
        table.add_row(
            escape(node["node"][:16]),
            str(node["sessions"]),
            escape(resources),
            escape(str(node["tree_kill"])),
            escape(str(node["limits"])),
            escape(isolation),
        )
    return table


def _capabilities_table(title: str, caps: Mapping[str, Any]) -> Any:
    from rich.table import Table

    def show(value: Any) -> str:
        if isinstance(value, bool):
            return "[green]yes[/green]" if value else "[red]no[/red]"
        if isinstance(value, list | tuple):
            return escape(", ".join(map(str, value))) if value else "[dim]none[/dim]"
        return "[red]unavailable[/red]" if value in (None, "") else escape(str(value))

    table = Table("MECHANISM", "", title=title, title_justify="left", box=None)
    names = {"tree_kill": "tree kill", "pidfd": "pidfd (exit without polling)", "subreaper": "child subreaper"}
    for key, value in caps.items():
        if isinstance(value, Mapping):
            for sub, item in value.items():
                label = f"{key.replace('_', ' ')}: {sub.replace('_', ' ')}"
                # Reasons hold commas of their own: one per line.
                shown = "\n".join(map(escape, item)) if sub == "passed_over" and item else show(item)
                if sub.endswith("_bytes") and isinstance(item, int):
                    shown = f"{item / (1 << 30):.1f} GiB" if item >= 1 << 30 else f"{item / (1 << 20):.1f} MiB"
                elif sub == "warning":
                    shown = f"[red]{escape(item)}[/red]" if item else "[green]none[/green]"
                elif key == "restarts" and sub == "not_held" and isinstance(item, Mapping):
                    # Sessions the holder refused: the rest survive, these would not.
                    told = f"{item.get('sessions')} running session(s) would not survive: {item.get('why')}"
                    shown = f"[red]{escape(told)}[/red]"
                elif key == "restarts" and sub == "unreturned" and isinstance(item, Mapping):
                    # Sessions this server ended as it started: the holder could not hand them back.
                    told = f"{item.get('sessions')} running session(s) ended at start: {item.get('why')}"
                    shown = f"[red]{escape(told)}[/red]"
                if key == "limits" and sub == "not_enforced" and item:
                    shown = f"[red]{shown}[/red]"
                table.add_row(label, shown)
        else:
            table.add_row(names.get(key, key.replace("_", " ")), show(value))
    return table


def main() -> None:
    code: str | int | None = 0
    try:
        app()
    except KeyboardInterrupt:
        code = 130
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, str | int | None) else 1
    if any(thread.is_alive() for thread in _STDIN_PUMPS):
        # A daemon thread in the middle of an HTTP call while the interpreter finalizes can crash
        # CPython (SIGSEGV, measured: 2 exits in 100); a pump still alive has nothing left to do
        # (the session ended, or its stdin never closes), so we end here, without finalizing.
        if isinstance(code, str):
            print(code, file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code if isinstance(code, int) else 0 if code is None else 1)
    sys.exit(code)


if __name__ == "__main__":
    main()
