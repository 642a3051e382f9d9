"""``procpilot mcp`` ready at once: the handshake answered while the server is still loading.

Codex CLI starts its MCP servers beside the model's first request and leaves out the tools of a
server that has not listed them by then; ``procpilot mcp`` took 0.75-0.9 s to answer
``initialize``, nearly all of it imports (the MCP SDK's models, pydantic, the engine). The answers
to ``initialize`` and ``tools/list`` depend only on this build, the command line, the environment
and the configuration file, so the server's own answers are kept in a small cache
(``$XDG_CACHE_HOME/procpilot/handshake/<key>.json``, the key a hash of all of those). When
``procpilot mcp`` serves stdio pipes and the cache has an entry, :func:`start_front` starts a
thread before anything heavy is imported; it reads the client's lines and answers a handshake-era
``initialize`` (for a protocol version the cache holds) and a plain ``tools/list`` at once, and
keeps every line it read. The thread only reads, parses JSON and writes; it imports nothing.

When the server is ready (transports/mcp_stdio.py), :func:`take` stops the thread and hands the
server every line the thread read, answered or not, in order: the SDK sees the same conversation
it would have seen, and its replies to the requests already answered are not written again, only
compared. A difference (a cache the key did not tell apart) is written to the cache, and a
different tool list is followed by ``notifications/tools/list_changed``, so a client lists again.
Without an entry (the first start of a build or a configuration), the answers shipped with
procpilot for that configuration (transports/handshake_seed.py: no setting in the environment,
one of the profiles, no ``--config`` or one whose keys change neither answer) are served the same
way, and the server's own answers fill the cache; a configuration the seed does not cover is
answered by the server once loaded, as before. A server that will not start after all (a value
in that file the settings refuse) answers the requests still waiting with its error
(:func:`refuse`). A 2026-07-28 request (an envelope in ``_meta``), an ``initialize`` without
the fields the SDK requires, a ``tools/list`` with a cursor and anything else are the server's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import stat
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

from procpilot.transports.handshake_seed import SETTINGS_VARIABLES, seed_answers

__all__ = [
    "NOT_STARTED",
    "SHAPED_ALIKE",
    "Handshake",
    "cache_path",
    "refuse",
    "reply_bytes",
    "start_front",
    "stdio_is_pipe",
    "take",
]

# The handshake-era versions (as transports/mcp_direct.py's SHAPED_ALIKE; a test holds them equal).
SHAPED_ALIKE = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})
_FORMAT = "1"  # of the cache's files: a change here is a new key, never a misread file
_KEEP = 32  # cache files kept (one per command line and configuration); the oldest go first
_READ = 1 << 16
_SWITCH_S = 0.0005
_INITIALIZE, _LIST = b'"initialize"', b'"tools/list"'
_MARKERS = (_INITIALIZE, _LIST)
_LIST_CHANGED = b'{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}\n'
NOT_STARTED = -32603  # JSON-RPC's internal error: the reply to a request a server that will not start read
# Environment variables that shape what `procpilot mcp` serves, besides every PROCPILOT_ one:
# the settings' own, and those their defaults and the tools' paths come from.
_ENV = frozenset({"HOME", "XDG_STATE_HOME", "PYTHONPATH"}) | SETTINGS_VARIABLES

Key = tuple[bool, object]  # a JSON-RPC id: 1 and "1" are different ids


def _key(request_id: object) -> Key | None:
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        return None
    return (isinstance(request_id, str), request_id)


# -- the cache -------------------------------------------------------------------------------------


def _sources(digest: Any) -> None:
    """This build: every module of procpilot (path, size, time), and the SDK's entry modules."""
    package = Path(__file__).resolve().parents[1]
    stack = [package]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_dir(follow_symlinks=False) and entry.name != "__pycache__":
                    stack.append(Path(entry.path))
                elif entry.name.endswith(".py"):
                    info = entry.stat()
                    digest.update(f"{entry.path}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    from importlib.util import find_spec  # finds a module without running it

    for name in ("mcp", "mcp_types", "pydantic"):
        with contextlib.suppress(Exception):
            spec = find_spec(name)
            origin = spec.origin if spec is not None else None
            if origin:
                info = os.stat(origin)
                digest.update(f"{origin}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())


def _config_bytes(argv: Sequence[str]) -> bytes:
    """The bytes of every file a ``--config`` names (the last one is read: all are keyed).

    Only a regular file is read: ``--config <(...)`` names a pipe, whose bytes a read here would
    take from the settings (which then read it empty). A pipe is keyed by its name alone, and
    the seed never covers it (transports/handshake_seed.py), so the server answers."""
    found = b""
    for i, arg in enumerate(argv):
        path = argv[i + 1] if arg == "--config" and i + 1 < len(argv) else None
        if arg.startswith("--config="):
            path = arg.partition("=")[2]
        if path is not None:
            try:
                found += (Path(path).read_bytes() if Path(path).is_file() else b"\0not a file") + b"\0"
            except OSError:
                found += b"\0unreadable\0"
    return found


def cache_path(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Path | None:
    """The cache file for ``procpilot mcp`` with ``argv`` (its options) here and now; None when
    no cache directory can be named (no HOME)."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        root = Path(xdg)
    elif env.get("HOME"):
        root = Path(env["HOME"]) / ".cache"
    else:
        return None
    # Not the working directory: what is served does not depend on it (a relative --config is
    # read here, its bytes in the key), so one entry serves every project a client starts it in.
    digest = hashlib.sha256(f"{_FORMAT}\0{sys.executable}\0{sys.version}\n".encode())
    digest.update(json.dumps(list(argv)).encode())
    shaping = sorted((k, v) for k, v in env.items() if k.startswith("PROCPILOT_") or k in _ENV)
    digest.update(json.dumps(shaping).encode())
    digest.update(_config_bytes(argv))
    _sources(digest)
    return root / "procpilot" / "handshake" / f"{digest.hexdigest()[:40]}.json"


def _load(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {"initialize": {}, "tools": {}}
    valid = isinstance(data, dict) and all(isinstance(data.get(k), dict) for k in ("initialize", "tools"))
    return data if valid else {"initialize": {}, "tools": {}}


def _store(path: Path, cache: Mapping[str, Any]) -> None:
    """Written whole (a reader sees the old file or the new one), and the oldest files pruned."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps(cache, ensure_ascii=False, separators=(",", ":")))
        os.replace(scratch, path)
        files = sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in files[_KEEP:]:
            old.unlink(missing_ok=True)


# -- the front: the handshake answered while the server loads --------------------------------------


def _plain_initialize(params: object) -> TypeGuard[dict[str, Any]]:
    """Whether an ``initialize``'s params are a handshake-era one's, in the shape the SDK requires
    (the fields it needs, of their types: a request without them is refused by the SDK, so it is
    left to the SDK); what the client's capabilities hold is not read."""
    if not isinstance(params, dict) or "_meta" in params or not isinstance(params.get("capabilities"), dict):
        return False
    client = params.get("clientInfo")
    return isinstance(client, dict) and isinstance(client.get("name"), str) and isinstance(client.get("version"), str)


class _Front:
    """A thread that answers ``initialize`` and ``tools/list`` from the cache and keeps every line."""

    def __init__(self, cache: dict[str, dict[str, Any]], fd_in: int = 0, fd_out: int = 1) -> None:
        self.cache = cache
        self.fd_in, self.fd_out = fd_in, fd_out
        self.lines: list[bytes] = []  # every whole line read, in order
        self.rest = b""  # the start of a line not ended yet
        self.eof = False
        self.answered: dict[Key, tuple[str, Any]] = {}  # id: (method, the result written)
        self._version: str | None = None
        self._stop_read, self._stop_write = os.pipe()
        # The main thread imports meanwhile, holding the GIL for up to the switch interval at a
        # time: a shorter one lets a reply out sooner (restored when the front stops).
        self._interval = sys.getswitchinterval()
        sys.setswitchinterval(_SWITCH_S)
        self._thread = threading.Thread(target=self._run, name="procpilot-handshake", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Any failure here only ends the front: the server reads on from where it stopped.
        with contextlib.suppress(Exception):
            while True:
                ready, _, _ = select.select([self.fd_in, self._stop_read], [], [])
                if self._stop_read in ready:
                    return
                chunk = os.read(self.fd_in, _READ)
                if not chunk:
                    self.eof = True
                    return
                data = self.rest + chunk
                *whole, self.rest = data.split(b"\n")
                for line in whole:
                    self.lines.append(line)
                    if any(marker in line for marker in _MARKERS):
                        self._answer(line)

    def _answer(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            return
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return
        key, params, method = _key(message.get("id")), message.get("params"), message.get("method")
        if key is None or key in self.answered:
            return
        result: Any = None
        if method == "initialize" and self._version is None and _plain_initialize(params):
            requested = params.get("protocolVersion")
            result = self.cache["initialize"].get(requested) if isinstance(requested, str) else None
            if not isinstance(result, dict) or result.get("protocolVersion") not in SHAPED_ALIKE:
                return
            self._version = result["protocolVersion"]
        elif method == "tools/list" and self._version is not None and params in (None, {}):
            result = self.cache["tools"].get(self._version)
        if not isinstance(result, dict):
            return
        view = memoryview(reply_bytes(message["id"], result))
        while view:
            view = view[os.write(self.fd_out, view) :]
        self.answered[key] = (str(method), result)

    def stop(self) -> None:
        os.write(self._stop_write, b"x")
        self._thread.join()
        os.close(self._stop_read)
        os.close(self._stop_write)
        sys.setswitchinterval(self._interval)


class Handshake:
    """The server's side: the lines the front read (:attr:`lines`, :attr:`rest`, :attr:`eof`,
    after :meth:`handover`), which replies were written already, and the cache to keep up to date."""

    def __init__(self, path: Path, cache: dict[str, dict[str, Any]], front: _Front | None) -> None:
        self._path = path
        self._cache = cache
        self._front = front
        self.lines: list[bytes] = []
        self.rest = b""
        self.eof = False
        self._answered: dict[Key, tuple[str, Any]] = {}
        self._asked: dict[Key, tuple[str, str | None]] = {}  # a request's id: (method, version asked)
        self._version: str | None = None

    def handover(self) -> None:
        """Stop the front (if one runs): from here the server reads stdin, after :attr:`lines`."""
        front, self._front = self._front, None
        if front is not None:
            front.stop()
            self.lines, self.rest, self.eof, self._answered = front.lines, front.rest, front.eof, front.answered

    def saw_request(self, line: bytes) -> None:
        """Note a handshake request the server is given (its answer fills the cache). Run on every
        line: most are no handshake request, and are dismissed by two substring searches."""
        if _INITIALIZE not in line and _LIST not in line:
            return
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            return
        if not isinstance(message, dict):
            return
        key, params, method = _key(message.get("id")), message.get("params"), message.get("method")
        if key is None:
            return
        if method == "initialize" and isinstance(params, dict) and "_meta" not in params:
            requested = params.get("protocolVersion")
            self._asked[key] = ("initialize", requested if isinstance(requested, str) else None)
        elif method == "tools/list" and params in (None, {}):
            self._asked[key] = ("tools/list", None)

    def unanswered(self) -> list[object]:
        """The ids of the requests in :attr:`lines` the front did not answer (after :meth:`handover`)."""
        ids: list[object] = []
        for line in self.lines:
            try:
                message = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(message, dict) and isinstance(message.get("method"), str):
                key = _key(message.get("id"))
                if key is not None and key not in self._answered:
                    ids.append(message["id"])
        return ids

    def wants(self, request_id: object) -> bool:
        """Whether the reply to ``request_id`` concerns the handshake (cheap: most do not)."""
        key = _key(request_id)
        return key is not None and (key in self._asked or key in self._answered)

    def saw_reply(self, reply: Mapping[str, Any]) -> tuple[bool, bytes]:
        """The server's reply (as JSON) to a request :meth:`wants`: whether it was written
        already (so it is not written again), and what to write instead (a list-changed
        notification when the tools the front listed were not the server's)."""
        key = _key(reply.get("id"))
        result = reply.get("result")
        asked = self._asked.pop(key, None) if key is not None else None
        changed = False
        if asked is not None and isinstance(result, dict):
            method, requested = asked
            if method == "initialize" and result.get("protocolVersion") in SHAPED_ALIKE and requested:
                self._version = result["protocolVersion"]
                changed = self._cache["initialize"].get(requested) != result
                self._cache["initialize"][requested] = result
            elif method == "tools/list" and self._version is not None:
                changed = self._cache["tools"].get(self._version) != result
                self._cache["tools"][self._version] = result
        if changed:
            _store(self._path, self._cache)
        sent = self._answered.pop(key, None) if key is not None else None
        if sent is None:
            return False, b""
        method, written = sent
        return True, _LIST_CHANGED if method == "tools/list" and written != result else b""


def reply_bytes(request_id: object, result: Mapping[str, Any]) -> bytes:
    """The line the front writes for a result: the bytes the SDK writes for it (for the seed,
    tests/transports/test_handshake_seed.py compares them)."""
    reply = {"jsonrpc": "2.0", "id": request_id, "result": result}
    return json.dumps(reply, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def stdio_is_pipe() -> bool:
    """Whether fd 0 and fd 1 are pipes or sockets (what an MCP client gives its server)."""
    try:
        modes = [os.fstat(fd).st_mode for fd in (0, 1)]
    except OSError:
        return False
    return all(stat.S_ISFIFO(m) or stat.S_ISSOCK(m) for m in modes)


_armed: list[Handshake] = []  # the handshake of this process, from the entry point to the server


def start_front(argv: Sequence[str]) -> None:
    """Before ``procpilot mcp`` (``argv``: its options) loads: when it will serve stdio pipes,
    start answering the handshake from the cache; :func:`take` is the server's side of it."""
    if _armed or any(arg in ("--http", "--help") or arg.startswith("--http=") for arg in argv):
        return
    if not stdio_is_pipe():
        return
    path = cache_path(argv)
    if path is None:
        return
    cache = _load(path)
    # Under what is cached, the answers procpilot shipped for a configuration they cover
    # (transports/handshake_seed.py): all of them on its first start, and what a server ended
    # before it answered (a client gone at once, say) on a later one.
    seed = seed_answers(argv, os.environ, sorted(SHAPED_ALIKE))
    answers = {part: {**seed[part], **cache[part]} for part in ("initialize", "tools")}
    _armed.append(Handshake(path, cache, _Front(answers) if answers["initialize"] else None))


def take() -> Handshake | None:
    """The handshake started for this process, once (None for a server started otherwise)."""
    return _armed.pop() if _armed else None


def refuse(error: Mapping[str, Any]) -> None:
    """``procpilot mcp`` will not serve (its settings refused, say, a value in a ``--config``
    file the seed covered by its keys alone) though the front may have answered the handshake:
    stop the front, and answer each request it read and left unanswered with a JSON-RPC error
    carrying ``error`` (the typed error, as ``to_dict`` gives it), so the client reads why
    before the server's stdout closes. Nothing once the server has taken the handshake (the
    server answers its own requests then)."""
    handshake = take()
    if handshake is None:
        return
    handshake.handover()
    message = f"procpilot mcp did not start: {error.get('error')}: {error.get('message')}"
    for request_id in handshake.unanswered():
        reply = {"jsonrpc": "2.0", "id": request_id, "error": {"code": NOT_STARTED, "message": message, "data": error}}
        line = json.dumps(reply, default=str).encode() + b"\n"  # ASCII: a lone surrogate is escaped
        with contextlib.suppress(OSError):  # a client gone: the error is on stderr still
            view = memoryview(line)
            while view:
                view = view[os.write(1, view) :]
