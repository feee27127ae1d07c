"""A WebSocket echo server from the Python standard library alone (what a sandbox has), for the
preview tests: `python3 ws_echo_server.py PORT` listens on 127.0.0.1:PORT, answers the RFC 6455
handshake on any path and sends every text message back prefixed with "echo: "."""

import base64
import hashlib
import socket
import struct
import sys
import threading

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def read_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def serve(conn):
    request = b""
    while b"\r\n\r\n" not in request:
        chunk = conn.recv(4096)
        if not chunk:
            return
        request += chunk
    headers = {}
    for line in request.split(b"\r\n")[1:]:
        if b":" in line:
            name, value = line.split(b":", 1)
            headers[name.strip().lower()] = value.strip()
    key = headers.get(b"sec-websocket-key", b"").decode()
    accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
    conn.sendall(
        (
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept}\r\n\r\n"
        ).encode()
    )
    while True:
        first, second = read_exact(conn, 2)
        opcode, length = first & 0x0F, second & 0x7F
        if length == 126:
            (length,) = struct.unpack(">H", read_exact(conn, 2))
        elif length == 127:
            (length,) = struct.unpack(">Q", read_exact(conn, 8))
        mask = read_exact(conn, 4) if second & 0x80 else b"\0\0\0\0"
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(read_exact(conn, length)))
        if opcode == 0x8:
            conn.sendall(b"\x88\x00")
            return
        if opcode == 0x1:
            reply = b"echo: " + payload
            header = bytes([0x81, len(reply)]) if len(reply) < 126 else bytes([0x81, 126]) + struct.pack(">H", len(reply))
            conn.sendall(header + reply)


def main():
    port = int(sys.argv[1])
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=lambda c=conn: (serve_safely(c)), daemon=True).start()


def serve_safely(conn):
    try:
        serve(conn)
    except (ConnectionError, OSError):
        pass
    finally:
        conn.close()


if __name__ == "__main__":
    main()
