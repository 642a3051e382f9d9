"""A web page an agent serves on another port of the host, as any agent may (issue 20).

Prints ``listening PORT``, then ``cookie: <the Cookie header>`` for every request a browser makes
to it: browsers send a host's cookies to all its ports. ``GET /toss?c=NAME=VALUE`` also answers
with ``Set-Cookie: NAME=VALUE`` for each ``c``, at ``Path=/`` and ``Path=/console`` (the second
is sent first to the console's paths), as any page of the host may set cookies for all its ports.
"""

import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlparse


class Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        print(f"cookie: {self.headers.get('Cookie', '')}", flush=True)
        body = b"<!doctype html><title>an agent's page</title><p>nothing to see</p>"
        self.send_response(200)
        for cookie in parse_qs(urlparse(self.path).query).get("c", []):
            for path in ("/", "/console"):
                self.send_header("Set-Cookie", f"{cookie}; Path={path}; HttpOnly; SameSite=Strict")
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return  # stdout carries the cookie lines only


server = HTTPServer((sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1", 0), Page)
print(f"listening {server.server_port}", flush=True)
server.serve_forever()
