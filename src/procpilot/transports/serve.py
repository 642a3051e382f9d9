"""Running the daemon: one supervisor, the HTTP app on a TCP port and/or a Unix socket, signals.

``serve`` binds the sockets itself (so port 0 and a Unix socket work together under one uvicorn
server and one app lifespan), prints where it listens, writes ``<state_dir>/daemon.json`` for the
CLI to find it, and on SIGTERM/SIGINT/SIGQUIT: closes the streams clients hold open,
forwards the signal to every session tree (SIGKILL after the grace period), stops serving, and
returns only when every tree is gone. Connections still open after the grace period (plus 5 s) are cut.
SIGUSR2 leaves the sessions running to the next server instead; SIGHUP does too, and runs the
daemon again in this process (reexec.py), unless it came from a terminal that hung up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import operator
import os
import signal
import socket
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from procpilot import wire
from procpilot.config import ServerSettings, Settings
from procpilot.contract import ToolSpec
from procpilot.engine.events import EventBus
from procpilot.engine.state_files import check_state_file, damaged, make_state_dir, open_state_file
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import ServeRefused
from procpilot.transports.reexec import Reload, inherited_listeners

if TYPE_CHECKING:
    from procpilot.policy.gate import Gate

__all__ = [
    "SHUTDOWN_SIGNALS",
    "DaemonAddress",
    "ServeRefused",
    "Toolset",
    "audit_file",
    "build_tools",
    "build_toolset",
    "check_binding",
    "daemon_file",
    "make_supervisor",
    "proc_handler_factory",
    "record_audit",
    "serve",
]

SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
# Stop serving and leave every session running for the next server (``serve --takeover`` sends it).
HANDOVER_SIGNAL = signal.SIGUSR2
_TAKEOVER_WAIT = 60.0


@dataclass(frozen=True, slots=True)
class DaemonAddress:
    url: str | None  # http://host:port, when listening on TCP
    unix_socket: str | None

    @property
    def client_url(self) -> str:
        """What ``procpilot.Client`` and the CLI take: the TCP URL, else ``unix://<path>``."""
        if self.url:
            return self.url
        return f"unix://{self.unix_socket}"


def check_binding(server: ServerSettings, *, tcp: bool = True) -> None:
    """Anything but the loopback needs bearer tokens: refuse to start otherwise."""
    if not tcp and server.unix_socket is None:
        raise ServeRefused("nothing to listen on: no TCP port and no Unix socket", hints={"add_socket": _SOCK})
    if tcp and not server.loopback_only and not server.tokens:
        raise ServeRefused(
            f"refusing to listen on {server.host}: without [server.tokens] anyone who can reach it could run commands",
            hints={"add_tokens": _TOKENS},
        )


_BACKLOG = 2048
_TOKENS = 'Add [server.tokens] ("token" = "agent-id") to the config, or bind 127.0.0.1.'
_SOCK = "Give --unix-socket PATH (or [server] unix_socket), or drop --no-tcp."


def daemon_file(settings: Settings) -> Path:
    return settings.state_dir / "daemon.json"


def make_supervisor(settings: Settings, *, owner: str | None = None) -> Supervisor:
    """The supervisor, with the per-agent policy on every spawn and every write to a stdin.

    ``owner`` names whose sessions these are across restarts ("serve", "mcp:<agent>"): the next
    server of the same owner on this state directory adopts what this one leaves running."""
    from procpilot.policy.spawn_filter import make_spawn_filter, make_write_filter

    spawn_filter, write_filter = make_spawn_filter(settings), make_write_filter(settings)
    if settings.cluster.backend == "ray":
        # Imported only here: the single-host daemon never loads Ray.
        from procpilot.cluster.launcher import RayLauncher

        return Supervisor(
            settings,
            spawn_filter=spawn_filter,
            write_filter=write_filter,
            launcher=RayLauncher(settings, node_filter=make_spawn_filter),
        )
    return Supervisor(
        settings,
        spawn_filter=spawn_filter,
        write_filter=write_filter,
        owner=owner,
        descriptors_for=(settings.server.max_running_sessions, settings.server.max_connections),
    )


@dataclass(frozen=True, slots=True)
class Toolset:
    tools: list[ToolSpec]
    audit: EventBus[Any]  # the gate's: every notify-tier call and approval decision
    gate: Gate  # the policy gate (approvals are decided through it)


def build_toolset(supervisor: Supervisor, settings: Settings) -> Toolset:
    """Every face's tools, behind the permission gate."""
    from procpilot.faces.all_tools import all_tools, served
    from procpilot.policy.gate import Gate

    gate = Gate(settings)
    # The gate is the one audit wrapper. Renamed after the gate: policy tiers and audit events
    # keep the tools' own names.
    tools = served(list(gate.wrap(all_tools(supervisor))), settings)
    return Toolset(tools, gate.audit, gate)


def build_tools(supervisor: Supervisor, settings: Settings) -> tuple[list[ToolSpec], EventBus[Any]]:
    """Every face's tools, behind the permission gate, and the bus their audit events go to."""
    toolset = build_toolset(supervisor, settings)
    return toolset.tools, toolset.audit


def audit_file(settings: Settings) -> Path:
    return settings.state_dir / "audit.jsonl"


def record_audit(bus: EventBus[Any], path: Path) -> Callable[[], None]:
    """Append every audit event on ``bus`` to ``path`` as one JSON line (0600); returns the remover.

    Events carry agent ids, never tokens (the transports resolve tokens before any tool runs).
    One write per event in append mode, so concurrent writers never interleave within a line.
    """
    import dataclasses

    make_state_dir(path.parent, "the state directory")
    fd = open_state_file(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, "the audit log")

    # Each event class's field names and a getter of their values, found once per class (the
    # walk over its fields was ~10 µs of every audited call after idle).
    layouts: dict[type, tuple[tuple[str, ...], Callable[[Any], Any]]] = {}

    def write(event: Any) -> None:
        cls = type(event)
        layout = layouts.get(cls)
        if layout is None:
            names = tuple(f.name for f in dataclasses.fields(event)) if dataclasses.is_dataclass(cls) else ()
            # attrgetter of one name gives its value, of several a tuple: always a tuple here
            get = operator.attrgetter(*names) if len(names) > 1 else lambda e: tuple(getattr(e, n) for n in names)
            layout = layouts[cls] = (names, get)
        names, get = layout
        # Its fields as they are (asdict would deep-copy the arguments first; the line is the same)
        data = {"event": cls.__name__}
        data.update(zip(names, get(event), strict=True))
        # wire: a line of the record is written whatever text the agent sent (a lone surrogate
        # is U+FFFD), never lost to an encoding error
        line = wire.dumps_bytes(data, separators=(", ", ": ")) + b"\n"
        try:
            os.write(fd, line)
        except OSError:
            logging.getLogger(__name__).exception("could not append to the audit log %s", path)

    remove = bus.add_callback(write)

    def close() -> None:
        remove()
        with contextlib.suppress(OSError):
            os.close(fd)

    return close


def proc_handler_factory(settings: Settings | None = None) -> Callable[[Supervisor, str], Any]:
    """One proc/* handler per WebSocket connection, for the connection's agent, configured by
    ``[proc]`` (spec 003's defaults without settings)."""
    from procpilot.faces.proc_protocol import ProcConfig, ProcHandler

    config = None
    if settings is not None:
        proc = settings.proc
        config = ProcConfig(
            allowed_commands=list(proc.allowed_commands) if proc.allowed_commands is not None else None,
            timeout=proc.timeout or None,  # 0 in TOML: no limit
            max_output_bytes=proc.max_output_bytes,
            max_procs=proc.max_procs,
            network_disabled=proc.network_disabled,
        )
    spawned: dict[str, set[str]] = {}  # shared by all connections: max_procs holds per agent

    def handler(supervisor: Supervisor, agent: str) -> Any:
        return ProcHandler(supervisor, agent, config, spawned)

    return handler


def bind_listeners(
    server: ServerSettings, *, tcp: bool, inherited: tuple[socket.socket | None, socket.socket | None] = (None, None)
) -> tuple[list[socket.socket], DaemonAddress]:
    """Listen on TCP (unless ``tcp`` is False) and the Unix socket the settings name, or go on
    listening on the ``inherited`` ones (TCP, Unix) a previous image of the daemon bound."""
    sockets: list[socket.socket] = []
    url = None
    path = None
    inherited_inet, inherited_unix = inherited
    try:
        if inherited_inet is not None:
            sockets.append(inherited_inet)
            host, port = inherited_inet.getsockname()[:2]
            url = f"http://[{host}]:{port}" if inherited_inet.family == socket.AF_INET6 else f"http://{host}:{port}"
        elif tcp:
            family = socket.AF_INET6 if ":" in server.host else socket.AF_INET
            # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only when it is said.
            inet = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            sockets.append(inet)
            inet.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            inet.bind((server.host, server.port))
            inet.listen(_BACKLOG)  # from now on clients queue up, even before the app has started
            inet.set_inheritable(False)
            port = inet.getsockname()[1]
            host = f"[{server.host}]" if family == socket.AF_INET6 else server.host
            url = f"http://{host}:{port}"
        if inherited_unix is not None:
            sockets.append(inherited_unix)
            path = str(server.unix_socket)
        elif server.unix_socket is not None:
            path = str(server.unix_socket)
            _remove_stale_socket(path)
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sockets.append(unix)
            old = os.umask(0o177)  # the socket is created 0600: only its owner may connect
            try:
                unix.bind(path)
                unix.listen(_BACKLOG)
            finally:
                os.umask(old)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        where = f"{server.host}:{server.port}" if url is None else path
        message = f"cannot listen on {where}: {exc.strerror or exc}"
        raise ServeRefused(message, hints={"free_it": _busy_hint()}) from None
    return sockets, DaemonAddress(url, path)


def _busy_hint() -> str:
    return (
        "Stop the other server on that address (procpilot ps tells if it is a procpilot daemon), or pick "
        "another port: --port N (PORT=N make run)."
    )


def _remove_stale_socket(path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(17, f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody listens: left by a daemon that did not stop cleanly
        return
    finally:
        probe.close()
    raise OSError(98, "another daemon is listening on it")


def uvicorn_server(config: Any) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """Leaves signals to us: uvicorn would re-raise them after serving, before sessions end."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Server(config)


@contextlib.asynccontextmanager
async def daemon_app(supervisor: Supervisor, settings: Settings, *, open_agent: str = "default") -> AsyncIterator[Any]:
    """The daemon's ASGI app over ``supervisor``: every face's tools behind the gate, the audit
    log in the state directory, the proc/* handler. What ``serve`` binds to its sockets, and what
    an in-process client (tests, an embedding program) drives directly."""
    from procpilot.transports.http import create_app

    toolset = build_toolset(supervisor, settings)
    stop_audit = record_audit(toolset.audit, audit_file(settings))
    logging.getLogger("mcp").setLevel(logging.WARNING)  # the SDK logs each session at INFO
    try:
        yield create_app(
            supervisor,
            toolset.tools,
            settings,
            audit=toolset.audit,
            audit_file=audit_file(settings),
            open_agent=open_agent,
            proc_handler=proc_handler_factory(settings),
            gate=toolset.gate,
        )
    finally:
        stop_audit()


async def serve_until_signal(
    sup: Supervisor,
    serve: Callable[[], Awaitable[None]],
    stop: Callable[[], None] | None = None,
    *,
    prepare: Callable[[], Awaitable[None]] | None = None,
    keep: bool = False,
    reload: Reload | None = None,
) -> int:
    """Run ``serve`` until it returns or a shutdown signal comes; returns the signal (0 if none).

    On the first SIGTERM/SIGINT/SIGHUP/SIGQUIT: ``stop()`` (default: cancel ``serve``) and, at
    once, ``prepare()`` (refuse new work) and the end of every session tree with that signal,
    SIGKILL after the grace period, while ``serve`` winds down. Later signals change nothing: the
    shutdown is already bounded by the grace period. Every server procpilot runs (the daemon,
    ``procpilot mcp`` over stdio or HTTP) stops this one way.

    SIGUSR2, and with ``keep`` every way of stopping (a signal, or ``serve`` returning: a stdio
    client that went away), leaves the running sessions to the next server instead
    (``Supervisor.detach``; where no holder keeps them, they end as before); so does the SIGHUP
    that asks ``reload`` (the daemon's) for a re-exec. With ``reload``, signals caught before this
    was called are acted on now, and those after a re-exec was asked for are kept for the new image.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(serve())
    received: list[int] = []
    stopping: list[asyncio.Future[None]] = []
    reexec = reload is not None and reload.asked

    async def shut_down(sig: int) -> None:
        if prepare is not None:
            await prepare()
        if keep or sig == HANDOVER_SIGNAL or reexec:
            await sup.detach()
        else:
            await sup.aclose(sig)

    def on_signal(sig: int) -> None:
        nonlocal reexec
        if received:
            if reexec and reload is not None and sig not in reload.later:
                reload.later.append(sig)  # for the new image: this one is past acting on it
            return
        answer = "stop" if reload is None else reload.answer(sig)
        if answer == "ignore":
            return
        received.append(sig)
        reexec = answer == "reexec"
        stopping.append(asyncio.ensure_future(shut_down(sig)))
        (stop or task.cancel)()

    for sig in (*SHUTDOWN_SIGNALS, HANDOVER_SIGNAL):
        loop.add_signal_handler(sig, on_signal, sig)
    for early in reload.early if reload is not None else []:
        on_signal(early)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        for sig in (*SHUTDOWN_SIGNALS, HANDOVER_SIGNAL):
            # Before a re-exec every signal stays caught (see Reload): a default action now would
            # end the process before the new image runs.
            if not reexec:
                loop.remove_signal_handler(sig)
        for future in stopping:
            with contextlib.suppress(Exception):
                await future
        if keep:
            await sup.detach()
        await sup.aclose(received[0] if received else signal.SIGTERM)  # a no-op after a detach
    return received[0] if received else 0


async def serve(
    settings: Settings,
    *,
    open_agent: str = "default",
    tcp: bool = True,
    announce: Callable[[DaemonAddress], None] | None = None,
    keep_sessions: bool = False,
    takeover: bool = False,
    recheck: Callable[[], Settings] | None = None,
) -> int:
    """Serve until a shutdown signal; returns the signal number that stopped it (0 if none).

    SIGUSR2 (and, with ``keep_sessions``, every shutdown signal) stops serving but leaves each
    running session to the next server on this state directory. ``takeover`` first asks the
    daemon that runs there (daemon.json) to do just that, and waits for it to go. SIGHUP hands
    everything over the same way and runs this command line again in this process (reexec.py),
    never returning; from a terminal that hung up it ends every session as before. ``recheck``
    loads the configuration as the command line does: a SIGHUP while it fails changes nothing."""
    import uvicorn

    from procpilot.transports.connections import guarded_http
    from procpilot.transports.http import WS_MAX_MESSAGE, daemon_of

    def startable() -> None:  # what a new image checks first: a config that loads, a binding and a layout it allows
        if recheck is not None:
            from procpilot.policy.daemon_files import check_daemon_files

            again = recheck()
            check_binding(again.server, tcp=tcp)
            check_daemon_files(again)

    reload = Reload(startable)
    reload.catch_early((*SHUTDOWN_SIGNALS, HANDOVER_SIGNAL))
    check_binding(settings.server, tcp=tcp)
    make_state_dir(settings.state_dir, "the state directory")
    marker = daemon_file(settings)
    for path in (marker, _marker_tmp(marker)):  # written once serving: found damaged before anything starts
        check_state_file(path, _MARKER)
    inherited = inherited_listeners(settings.server, tcp=tcp)
    if takeover and inherited == (None, None):  # a re-exec'd daemon takes over from nobody
        await asyncio.to_thread(_take_over, daemon_file(settings))
    sockets, address = bind_listeners(settings.server, tcp=tcp, inherited=inherited)
    reload.sockets = sockets
    stopped_by = 0
    try:
        async with (
            make_supervisor(settings, owner="serve") as sup,
            daemon_app(sup, settings, open_agent=open_agent) as app,
        ):
            daemon = daemon_of(app)
            grace = settings.exec.kill_grace_sec
            config = uvicorn.Config(
                app,
                log_level="warning",
                access_log=False,
                lifespan="on",
                ws="websockets-sansio",
                timeout_graceful_shutdown=int(grace) + 5,
                ws_ping_interval=20.0,
                ws_max_size=WS_MAX_MESSAGE,
                http=guarded_http(settings.server),
                # Nothing here reads a client's address or scheme, so nothing is taken from the
                # X-Forwarded-* headers any local process may send (and no middleware per request).
                proxy_headers=False,
            )
            server = uvicorn_server(config)

            async def serving() -> None:
                _write_marker(marker, address)
                if announce is not None:
                    announce(address)
                await server.serve(sockets=sockets)

            stopped_by = await serve_until_signal(
                sup,
                serving,
                lambda: setattr(server, "should_exit", True),
                prepare=daemon.begin_shutdown,
                keep=keep_sessions,
                reload=reload,
            )
    finally:
        for sock in sockets:
            sock.close()
        if not reload.asked:  # a re-exec keeps listening there, and daemon.json stays true
            if address.unix_socket:
                with contextlib.suppress(OSError):
                    os.unlink(address.unix_socket)
            with contextlib.suppress(OSError, ValueError, AttributeError):  # not ours, or not JSON: left be
                if json.loads(marker.read_text()).get("pid") == os.getpid():
                    marker.unlink()
    if reload.asked:
        logging.getLogger(__name__).warning("SIGHUP: every session handed over; running again")
        reload.run()
    return stopped_by


def _take_over(marker: Path) -> None:
    """Ask the daemon named in ``marker`` to hand its sessions over, and wait until it is gone."""
    try:
        pid = int(json.loads(marker.read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # nobody to take over from: a plain start
    if pid == os.getpid():
        return  # our own previous image (a re-exec): it has handed over already
    try:
        os.kill(pid, HANDOVER_SIGNAL)
    except ProcessLookupError:
        return
    except PermissionError as exc:
        raise ServeRefused(
            f"cannot signal the running daemon (pid {pid}): {exc.strerror}",
            hints={"same_user": "Run the takeover as the user the running daemon runs as (or root)."},
        ) from None
    deadline = time.monotonic() + _TAKEOVER_WAIT
    while _running(pid):
        if time.monotonic() > deadline:
            raise ServeRefused(
                f"the running daemon (pid {pid}) did not hand over within {_TAKEOVER_WAIT:.0f} s",
                hints={"look": f"See why in its log, or stop it (kill {pid}) and start without --takeover."},
            )
        time.sleep(0.02)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie has let go of every port, socket and lock)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _write_marker(path: Path, address: DaemonAddress) -> None:
    """Where the daemon listens (never a token), for the CLI on the same machine."""
    data = {"url": address.client_url, "http": address.url, "unixSocket": address.unix_socket, "pid": os.getpid()}
    tmp = _marker_tmp(path)
    fd = open_state_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, _MARKER)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError as exc:
        raise damaged(path, _MARKER, f"cannot be written: {exc.strerror or exc}") from None


_MARKER = "where the CLI finds this daemon"


def _marker_tmp(path: Path) -> Path:
    return path.with_suffix(".tmp")
