"""The pinned `e2b` Python SDK (sync and async, debug mode) against `warren execd --e2b-listen`.

Usage: e2b_sdk_test.py URL ROOT. Every check runs; failures are printed by name and the script
exits non-zero. Prints "all e2b SDK checks passed" at the end otherwise.
"""

import asyncio
import os
import sys
import time
import traceback

from e2b import (
    AsyncSandbox,
    CommandExitException,
    FilesystemEventType,
    FileType,
    NotFoundException,
    PtySize,
    Sandbox,
    TimeoutException,
)

URL = sys.argv[1]
ROOT = sys.argv[2]
failures = []


def check(name):
    def wrap(fn):
        try:
            fn()
            print(f"ok   {name}")
        except Exception:  # noqa: BLE001 - every failure is reported by name
            failures.append(name)
            print(f"FAIL {name}\n{traceback.format_exc()}")
        return fn

    return wrap


def path(rel):
    return os.path.join(ROOT, rel)


sbx = Sandbox.create(debug=True, sandbox_url=URL)


@check("run captures stdout, stderr and the exit code")
def _():
    result = sbx.commands.run("echo out; echo err >&2")
    assert result.exit_code == 0, result
    assert result.stdout == "out\n", result
    assert result.stderr == "err\n", result


@check("a failing command raises CommandExitException with its code and output")
def _():
    try:
        sbx.commands.run("echo bad >&2; exit 3")
    except CommandExitException as e:
        assert e.exit_code == 3, e
        assert "bad" in e.stderr, e
    else:
        raise AssertionError("no exception")


@check("run takes envs and cwd")
def _():
    os.makedirs(path("cwd-dir"), exist_ok=True)
    result = sbx.commands.run("echo $GREETING; pwd", envs={"GREETING": "hello"}, cwd=path("cwd-dir"))
    assert result.stdout == f"hello\n{path('cwd-dir')}\n", result


@check("a timeout raises TimeoutException and kills the whole tree, sleep included")
def _():
    marker = path("timeout-marker")
    started = time.monotonic()
    try:
        # Long enough for the login shell's profile to finish: a kill in the middle of it can
        # leave the profile's own lock files behind (pyenv's rehash lock on some machines).
        sbx.commands.run(f"sleep 30; touch {marker}", timeout=3)
    except TimeoutException:
        pass
    else:
        raise AssertionError("no timeout")
    assert time.monotonic() - started < 15
    listed = sbx.commands.run("ps -eo args")
    assert "sleep 30" not in listed.stdout, listed.stdout


@check("a background command is listed, connected to, fed stdin and killed")
def _():
    handle = sbx.commands.run("read line; echo got:$line; sleep 60", background=True, stdin=True)
    pids = [p.pid for p in sbx.commands.list()]
    assert handle.pid in pids, pids
    sbx.commands.send_stdin(handle.pid, "hi\n")
    other = sbx.commands.connect(handle.pid)
    deadline = time.monotonic() + 10
    seen = []
    for stdout, _stderr, _pty in other:
        if stdout:
            seen.append(stdout)
        if "got:hi" in "".join(seen) or time.monotonic() > deadline:
            break
    assert "got:hi" in "".join(seen), seen
    assert sbx.commands.kill(handle.pid) is True
    try:
        handle.wait()
    except CommandExitException as e:
        assert e.exit_code != 0
    assert handle.pid not in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(handle.pid) is False


@check("a background command outlives the stream that started it")
def _():
    handle = sbx.commands.run(f"sleep 1; echo done > {path('outlived')}", background=True)
    handle.disconnect()
    deadline = time.monotonic() + 10
    while not os.path.exists(path("outlived")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert open(path("outlived")).read() == "done\n"


@check("a pty is created, typed into, resized and killed")
def _():
    import threading

    handle = sbx.pty.create(PtySize(rows=24, cols=80), timeout=30)
    output = []
    reader = threading.Thread(target=lambda: handle.wait(on_pty=lambda data: output.append(bytes(data))))
    reader.start()

    def wait_for(needle):
        deadline = time.monotonic() + 10
        while needle not in b"".join(output).decode(errors="replace"):
            assert time.monotonic() < deadline, (needle, output)
            time.sleep(0.05)

    sbx.pty.send_stdin(handle.pid, b"stty size\n")
    wait_for("24 80")
    sbx.pty.resize(handle.pid, PtySize(rows=40, cols=100))
    sbx.pty.send_stdin(handle.pid, b"stty size; exit 0\n")
    wait_for("40 100")
    reader.join(timeout=10)
    assert not reader.is_alive()
    other = sbx.pty.create(PtySize(rows=10, cols=10), timeout=30)
    assert sbx.pty.kill(other.pid) is True
    try:
        other.wait()
    except CommandExitException:
        pass


@check("files: text and bytes round trips, exists, get_info, list with depth")
def _():
    info = sbx.files.write(path("dir/a.txt"), "hello text")
    assert info.path == path("dir/a.txt"), info
    assert sbx.files.read(path("dir/a.txt")) == "hello text"
    sbx.files.write(path("dir/sub/b.bin"), b"\x00\x01\xff")
    assert bytes(sbx.files.read(path("dir/sub/b.bin"), format="bytes")) == b"\x00\x01\xff"
    assert sbx.files.exists(path("dir/a.txt"))
    assert not sbx.files.exists(path("dir/missing"))
    entry = sbx.files.get_info(path("dir/a.txt"))
    assert entry.type == FileType.FILE and entry.size == 10, entry
    names = sorted(e.name for e in sbx.files.list(path("dir")))
    assert names == ["a.txt", "sub"], names
    deep = sorted(e.path for e in sbx.files.list(path("dir"), depth=2))
    assert path("dir/sub/b.bin") in deep, deep


@check("files: a 20 MiB round trip")
def _():
    data = os.urandom(20 * 1024 * 1024)
    sbx.files.write(path("big.bin"), data)
    assert bytes(sbx.files.read(path("big.bin"), format="bytes")) == data


@check("files: make_dir, rename, remove")
def _():
    assert sbx.files.make_dir(path("made/deep")) is True
    assert sbx.files.make_dir(path("made/deep")) is False
    sbx.files.write(path("made/x.txt"), "x")
    moved = sbx.files.rename(path("made/x.txt"), path("made/y.txt"))
    assert moved.path == path("made/y.txt"), moved
    assert not sbx.files.exists(path("made/x.txt"))
    sbx.files.remove(path("made"))
    assert not sbx.files.exists(path("made"))


@check("files: missing paths raise NotFoundException")
def _():
    for call in (
        lambda: sbx.files.read(path("nope.txt")),
        lambda: sbx.files.get_info(path("nope.txt")),
        lambda: sbx.files.list(path("nope-dir")),
        lambda: sbx.files.watch_dir(path("nope-dir")),
    ):
        try:
            call()
        except NotFoundException:
            continue
        raise AssertionError("no NotFoundException")


@check("files: a path outside the root is refused")
def _():
    try:
        sbx.files.read("/etc/passwd")
    except Exception as e:  # noqa: BLE001
        assert "outside" in str(e), e
    else:
        raise AssertionError("read /etc/passwd")


@check("watch_dir (sync, polled watcher) reports create, write, rename and remove")
def _():
    os.makedirs(path("watched"), exist_ok=True)
    handle = sbx.files.watch_dir(path("watched"))
    sbx.files.write(path("watched/w.txt"), "one")
    with open(path("watched/w.txt"), "a") as f:
        f.write("two")
    os.rename(path("watched/w.txt"), path("watched/v.txt"))
    os.remove(path("watched/v.txt"))
    wanted = {FilesystemEventType.CREATE, FilesystemEventType.WRITE,
              FilesystemEventType.RENAME, FilesystemEventType.REMOVE}
    seen = set()
    deadline = time.monotonic() + 10
    while not wanted <= seen and time.monotonic() < deadline:
        seen |= {e.type for e in handle.get_new_events()}
        time.sleep(0.1)
    handle.stop()
    assert wanted <= seen, seen


async def async_checks():
    asbx = await AsyncSandbox.create(debug=True, sandbox_url=URL)
    result = await asbx.commands.run("echo async")
    assert result.stdout == "async\n", result
    try:
        await asbx.commands.run("exit 7")
    except CommandExitException as e:
        assert e.exit_code == 7
    else:
        raise AssertionError("no exception")
    ready = asyncio.Event()
    handle = await asbx.commands.run(
        "echo ready; sleep 60", background=True, on_stdout=lambda _: ready.set()
    )
    assert handle.pid in [p.pid for p in await asbx.commands.list()]
    # Killed once the login shell's profile has run (see the timeout check).
    await asyncio.wait_for(ready.wait(), 30)
    assert await asbx.commands.kill(handle.pid)
    await asbx.files.write(path("async.txt"), "async file")
    assert await asbx.files.read(path("async.txt")) == "async file"
    try:
        await asbx.files.read(path("async-missing"))
    except NotFoundException:
        pass
    else:
        raise AssertionError("no NotFoundException")
    os.makedirs(path("awatched"), exist_ok=True)
    events = []
    watch = await asbx.files.watch_dir(path("awatched"), on_event=events.append)
    await asbx.files.write(path("awatched/n.txt"), "n")
    deadline = time.monotonic() + 10
    while not any(e.name == "n.txt" and e.type == FilesystemEventType.CREATE for e in events):
        assert time.monotonic() < deadline, events
        await asyncio.sleep(0.1)
    await watch.stop()


@check("async: run, exit codes, background, kill, files, watch_dir stream")
def _():
    asyncio.run(async_checks())


if failures:
    print(f"{len(failures)} e2b SDK checks failed: {failures}")
    sys.exit(1)
print("all e2b SDK checks passed")
