"""`warren bench e2b`'s measurements through the pinned `e2b` Python SDK (debug mode) against one
envd URL: `commands.run("true")` latencies, a PTY keystroke's echo latency, and a 64 MiB
`files.write` + `files.read`. Usage: e2b_bench.py URL DIR N_RUNS. Prints one JSON object."""

import json
import os
import sys
import threading
import time

from e2b import PtySize, Sandbox

url, directory, n_runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
sbx = Sandbox.create(debug=True, sandbox_url=url)

for _ in range(5):
    sbx.commands.run("true")
run_ms = []
for _ in range(n_runs):
    started = time.perf_counter()
    sbx.commands.run("true")
    run_ms.append((time.perf_counter() - started) * 1000)

# A keystroke on a PTY running `cat`: from send_stdin until the terminal's echo arrives.
received = []
arrived = threading.Event()
handle = sbx.pty.create(PtySize(rows=24, cols=80), timeout=0)


def on_pty(data):
    received.append(bytes(data))
    arrived.set()


reader = threading.Thread(target=lambda: handle.wait(on_pty=on_pty), daemon=True)
reader.start()
sbx.pty.send_stdin(handle.pid, b"cat\n")
time.sleep(0.5)
key_ms = []
for n in range(50):
    arrived.clear()
    received.clear()
    started = time.perf_counter()
    sbx.pty.send_stdin(handle.pid, b"x")
    if not arrived.wait(5):
        break
    key_ms.append((time.perf_counter() - started) * 1000)
sbx.pty.kill(handle.pid)

data = os.urandom(64 * 1024 * 1024)
target = os.path.join(directory, "e2b-bench-64mib.bin")
started = time.perf_counter()
sbx.files.write(target, data)
write_s = time.perf_counter() - started
started = time.perf_counter()
back = sbx.files.read(target, format="bytes")
read_s = time.perf_counter() - started
assert bytes(back) == data, "the 64 MiB read differs from what was written"
sbx.files.remove(target)

print(json.dumps({"run_ms": run_ms, "key_ms": key_ms, "write_s": write_s, "read_s": read_s}))
