#!/usr/bin/env python3
"""A real HTTPS upstream for Warren's tests (Python 3 standard library only).

    https_upstream.py --bind IP --cert CERT --key KEY echo --require-header 'NAME: VALUE'
    https_upstream.py --bind IP --cert CERT --key KEY git --root DIR --user USER --password PASS

Binds an ephemeral port on IP, prints `PORT <n>` on stdout, and serves HTTP/1.1 with
keep-alive over TLS (every answer has a Content-Length). With --exit-with-stdin (before the
mode) it exits when its stdin closes: the test process that holds the pipe ended. Each
request is logged to stderr as `REQUEST <method> <path> <header>=present|absent` (never a
header's value); a connection whose TLS handshake fails is logged as `TLS-ERROR <why>`.

echo: every request (any method, any path) is answered with JSON
  {"method", "path" (with its query), "headers": {lowercased name: value}, "body": text},
  200 when the required header came with exactly the required value, else 401 (with
  `WWW-Authenticate: Bearer`). `/redirect?to=URL` answers 302 with `Location: URL` (401 when
  unauthorized). `/echo-header` answers with the required header's received value as a
  text/plain body and in the `X-Echo` header (200, or 401 when unauthorized).

git: git's smart HTTP through `git http-backend` as CGI (GIT_PROJECT_ROOT=DIR, every
  repository exported, REMOTE_USER=USER so pushes are allowed). Every request needs
  `Authorization: Basic base64(USER:PASS)`, else 401 with `WWW-Authenticate: Basic realm="git"`.
"""

import argparse
import base64
import http.server
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import urllib.parse

# How long a connection may sit idle (or a handshake take) before the server drops it.
IDLE_TIMEOUT = 60


def log(line):
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT

    def version_string(self):
        return "warren-test-upstream"

    def setup(self):
        # The handshake runs in this connection's thread, so a slow or broken client never
        # holds up the accept loop.
        self.request.settimeout(IDLE_TIMEOUT)
        self.request = self.server.tls.wrap_socket(self.request, server_side=True)
        super().setup()

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass

    # Any method.
    def __getattr__(self, name):
        if name.startswith("do_"):
            return self.handle_any
        raise AttributeError(name)

    def read_body(self):
        """The request's body, de-chunked when it came chunked."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = bytearray()
            while True:
                size_line = self.rfile.readline(65537)
                if not size_line:
                    raise ConnectionError("the chunked body ended early")
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    # Trailers, up to the empty line.
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(body)
                body += self.rfile.read(size)
                self.rfile.readline(65537)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def answer(self, status, body, headers=()):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()

    def handle_any(self):
        body = self.read_body()
        self.server.mode(self, body)


def echo_mode(required_name, required_value):
    def serve(handler, body):
        received = handler.headers.get(required_name)
        log(
            "REQUEST %s %s %s=%s"
            % (
                handler.command,
                handler.path,
                required_name.lower(),
                "present" if received is not None else "absent",
            )
        )
        authorized = received == required_value
        status = 200 if authorized else 401
        headers = [] if authorized else [("WWW-Authenticate", "Bearer")]
        url = urllib.parse.urlsplit(handler.path)
        if url.path == "/echo-header":
            value = received or ""
            handler.answer(
                status,
                value.encode("utf-8", "replace"),
                headers + [("Content-Type", "text/plain"), ("X-Echo", value)],
            )
            return
        if url.path == "/redirect":
            to = urllib.parse.parse_qs(url.query).get("to", [""])[0]
            if authorized:
                status = 302
                headers.append(("Location", to))
        seen = {}
        for name, value in handler.headers.items():
            seen[name.lower()] = value
        document = {
            "method": handler.command,
            "path": handler.path,
            "headers": seen,
            "body": body.decode("utf-8", "replace"),
        }
        handler.answer(
            status,
            json.dumps(document).encode(),
            headers + [("Content-Type", "application/json")],
        )

    return serve


def git_mode(root, user, password):
    expected = "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode()

    def serve(handler, body):
        authorization = handler.headers.get("Authorization")
        log(
            "REQUEST %s %s authorization=%s"
            % (handler.command, handler.path, "present" if authorization else "absent")
        )
        if authorization != expected:
            handler.answer(
                401,
                b"authentication required\n",
                [("WWW-Authenticate", 'Basic realm="git"'), ("Content-Type", "text/plain")],
            )
            return
        url = urllib.parse.urlsplit(handler.path)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": root,
            "GIT_HTTP_EXPORT_ALL": "1",
            "REMOTE_USER": user,
            "REMOTE_ADDR": handler.client_address[0],
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REQUEST_METHOD": handler.command,
            "PATH_INFO": urllib.parse.unquote(url.path),
            "QUERY_STRING": url.query,
            "CONTENT_TYPE": handler.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
        }
        for name, value in handler.headers.items():
            key = "HTTP_" + name.upper().replace("-", "_")
            if key in ("HTTP_AUTHORIZATION", "HTTP_TRANSFER_ENCODING", "HTTP_CONTENT_LENGTH"):
                continue
            # HTTP_CONTENT_ENCODING (gzip request bodies) and HTTP_GIT_PROTOCOL among them.
            env[key] = value
        done = subprocess.run(
            ["git", "http-backend"],
            input=body,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            check=False,
        )
        if done.stderr:
            log("git http-backend: " + done.stderr.decode("utf-8", "replace").strip())
        output = done.stdout
        head, separator, rest = output.partition(b"\r\n\r\n")
        if not separator:
            head, separator, rest = output.partition(b"\n\n")
        if not separator:
            handler.answer(
                502,
                b"git http-backend answered no CGI head (exit %d)\n" % done.returncode,
                [("Content-Type", "text/plain")],
            )
            return
        status = 200
        headers = []
        for line in head.decode("latin-1").splitlines():
            if not line.strip():
                continue
            name, _, value = line.partition(":")
            value = value.strip()
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name.lower() not in ("content-length", "transfer-encoding", "connection"):
                headers.append((name, value))
        handler.answer(status, rest, headers)

    return serve


def exit_with_stdin():
    while sys.stdin.buffer.read(65536):
        pass
    os._exit(0)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        error = sys.exc_info()[1]
        if isinstance(error, ssl.SSLError):
            log("TLS-ERROR %s" % error)
        elif isinstance(error, (ConnectionError, socket.timeout, TimeoutError)):
            log("CONNECTION-ERROR %s" % error)
        else:
            log("ERROR %r" % (error,))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bind", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument(
        "--exit-with-stdin",
        action="store_true",
        help="exit when stdin closes (the test process that holds it ended)",
    )
    modes = parser.add_subparsers(dest="mode", required=True)
    echo = modes.add_parser("echo")
    echo.add_argument("--require-header", required=True)
    git = modes.add_parser("git")
    git.add_argument("--root", required=True)
    git.add_argument("--user", required=True)
    git.add_argument("--password", required=True)
    args = parser.parse_args()

    if args.mode == "echo":
        name, separator, value = args.require_header.partition(":")
        if not separator:
            parser.error("--require-header takes 'NAME: VALUE'")
        mode = echo_mode(name.strip(), value.strip())
    else:
        mode = git_mode(os.path.abspath(args.root), args.user, args.password)

    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(args.cert, args.key)
    tls.set_alpn_protocols(["http/1.1"])

    family = socket.AF_INET6 if ":" in args.bind else socket.AF_INET
    Server.address_family = family
    server = Server((args.bind, 0), Handler)
    server.tls = tls
    server.mode = mode
    if args.exit_with_stdin:
        threading.Thread(target=exit_with_stdin, daemon=True).start()
    print("PORT %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
