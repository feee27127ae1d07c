"""Runs the OpenSandbox Python SDK (opensandbox==1.1.1) adapters against a bare `warren execd`.

Usage: opensandbox_sdk_test.py PORT WORKDIR

WORKDIR must be an existing directory the daemon may write (inside its --root). Every check
prints one line; the script exits non-zero, naming each failed check, if anything went wrong.
"""

import asyncio
import sys
import time
import traceback
from datetime import timedelta

from opensandbox.adapters.command_adapter import CommandsAdapter
from opensandbox.adapters.filesystem_adapter import FilesystemAdapter
from opensandbox.adapters.health_adapter import HealthAdapter
from opensandbox.config import ConnectionConfig
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.filesystem import (
    ContentReplaceEntry,
    DirectoryListEntry,
    MoveEntry,
    SearchEntry,
    SetPermissionEntry,
    WriteEntry,
)
from opensandbox.models.sandboxes import SandboxEndpoint

FAILURES: list[str] = []


def check(name: str, condition: bool, detail: object = "") -> None:
    if condition:
        print(f"ok   {name}")
    else:
        print(f"FAIL {name}: {detail}")
        FAILURES.append(name)


def stdout_of(execution) -> list[str]:
    return [m.text for m in execution.logs.stdout]


async def wait_for(what: str, probe, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def commands_checks(commands: CommandsAdapter, workdir: str) -> None:
    execution = await commands.run("echo hello; echo oops >&2")
    check("run: foreground stdout", stdout_of(execution) == ["hello"], stdout_of(execution))
    check("run: foreground stderr", [m.text for m in execution.logs.stderr] == ["oops"], execution.logs.stderr)
    check("run: exit code 0", execution.exit_code == 0, execution.exit_code)
    check("run: id is 32 hex", execution.id is not None and len(execution.id) == 32, execution.id)
    check("run: completion event", execution.complete is not None, execution)

    execution = await commands.run("exit 7")
    check("run: failing exit code", execution.exit_code == 7, execution.exit_code)
    check("run: error value", execution.error is not None and execution.error.value == "7", execution.error)

    execution = await commands.run(["echo", "$NOT_EXPANDED"])
    check("run: argv without a shell", stdout_of(execution) == ["$NOT_EXPANDED"], stdout_of(execution))

    execution = await commands.run(
        "pwd; echo $WARREN_SDK_VAR",
        opts=RunCommandOpts(working_directory=workdir, envs={"WARREN_SDK_VAR": "set"}),
    )
    check("run: cwd and envs", stdout_of(execution) == [workdir, "set"], stdout_of(execution))

    execution = await commands.run("sleep 30", opts=RunCommandOpts(timeout=timedelta(milliseconds=300)))
    check("run: timeout gives -1", execution.exit_code == -1, execution.exit_code)

    background = await commands.run(
        "echo first; echo second >&2; echo third", opts=RunCommandOpts(background=True)
    )
    check("run: background returns an id", background.id is not None, background)

    async def finished():
        status = await commands.get_command_status(background.id)
        return status if status.running is False else None

    status = await wait_for("the background command to finish", finished)
    check("status: exit code", status.exit_code == 0, status)
    check("status: content", status.content == "echo first; echo second >&2; echo third", status.content)
    check("status: times", status.started_at is not None and status.finished_at is not None, status)

    logs = await commands.get_background_command_logs(background.id)
    check("logs: content", logs.content == "first\nsecond\nthird\n", logs.content)
    check("logs: cursor", logs.cursor == len("first\nsecond\nthird\n"), logs.cursor)
    logs = await commands.get_background_command_logs(background.id, cursor=6)
    check("logs: from a cursor", logs.content == "second\nthird\n", logs.content)

    sleeper = await commands.run("sleep 60", opts=RunCommandOpts(background=True))
    status = await commands.get_command_status(sleeper.id)
    check("interrupt: running before", status.running is True, status)
    await commands.interrupt(sleeper.id)

    async def interrupted():
        status = await commands.get_command_status(sleeper.id)
        return status if status.running is False else None

    status = await wait_for("the interrupted command to stop", interrupted)
    check("interrupt: exit code -1", status.exit_code == -1, status)

    try:
        await commands.get_command_status("0" * 32)
        check("status: unknown id raises", False, "no exception")
    except Exception as exc:  # noqa: BLE001 - any SDK exception is the expected outcome
        check("status: unknown id raises", "404" in str(exc) or "not found" in str(exc).lower(), exc)

    session = await commands.create_session(working_directory=workdir)
    check("session: created", bool(session), session)
    first = await commands.run_in_session(session, "export KEPT=yes; mkdir -p inner; cd inner")
    check("session: first run completes", first.exit_code == 0, first)
    second = await commands.run_in_session(session, "echo $KEPT; pwd; echo merged >&2")
    check(
        "session: state persists",
        stdout_of(second) == ["yes", f"{workdir}/inner", "merged"],
        stdout_of(second),
    )
    failing = await commands.run_in_session(session, "false")
    check("session: failing run", failing.exit_code == 1, failing.exit_code)
    await commands.delete_session(session)
    try:
        await commands.run_in_session(session, "true")
        check("session: deleted session refuses runs", False, "no exception")
    except Exception as exc:  # noqa: BLE001
        check("session: deleted session refuses runs", "context not found" in str(exc), exc)


async def filesystem_checks(files: FilesystemAdapter, workdir: str) -> None:
    base = f"{workdir}/fs"
    await files.create_directories([WriteEntry(path=base, mode=755)])
    await files.write_file(f"{base}/a.txt", "alpha\nbeta\ngamma\n", mode=644)
    await files.write_files(
        [
            WriteEntry(path=f"{base}/sub/b.txt", data="bee"),
            WriteEntry(path=f"{base}/sub/c.bin", data=b"\x00\x01\xff"),
        ]
    )
    text = await files.read_file(f"{base}/a.txt")
    check("fs: write then read", text == "alpha\nbeta\ngamma\n", text)
    check("fs: read bytes", await files.read_bytes(f"{base}/sub/c.bin") == b"\x00\x01\xff")
    check("fs: read a range", await files.read_file(f"{base}/a.txt", range_header="bytes=0-4") == "alpha")
    lines = await files.read_file(f"{base}/a.txt", offset=2, limit=1)
    check("fs: read lines", lines == "beta\n", lines)

    info = await files.get_file_info([f"{base}/a.txt", f"{base}/sub"])
    a_info = info.get(f"{base}/a.txt")
    check("fs: info of a file", a_info is not None and a_info.size == 17 and a_info.mode == 644, a_info)
    sub_info = info.get(f"{base}/sub")
    check("fs: info of a directory", sub_info is not None and sub_info.entry_type == "directory", sub_info)

    listing = await files.list_directory(DirectoryListEntry(path=base, depth=2))
    paths = [entry.path for entry in listing]
    expected = [f"{base}/a.txt", f"{base}/sub", f"{base}/sub/b.txt", f"{base}/sub/c.bin"]
    check("fs: list", paths == expected, paths)

    found = await files.search(SearchEntry(path=base, pattern="*.txt"))
    check("fs: search", sorted(e.path for e in found) == [f"{base}/a.txt", f"{base}/sub/b.txt"], found)

    await files.move_files([MoveEntry(src=f"{base}/sub/b.txt", dest=f"{base}/moved/b2.txt")])
    check("fs: move", await files.read_file(f"{base}/moved/b2.txt") == "bee")

    await files.replace_contents([ContentReplaceEntry(path=f"{base}/a.txt", old_content="a", new_content="A")])
    text = await files.read_file(f"{base}/a.txt")
    check("fs: replace", text == "AlphA\nbetA\ngAmmA\n", text)
    results = await files.replace_contents_detailed(
        [ContentReplaceEntry(path=f"{base}/a.txt", old_content="A", new_content="a")]
    )
    check("fs: replace counts", [r.replaced_count for r in results] == [5], results)

    await files.set_permissions([SetPermissionEntry(path=f"{base}/a.txt", mode=600)])
    info = await files.get_file_info([f"{base}/a.txt"])
    check("fs: permissions", info[f"{base}/a.txt"].mode == 600, info)

    await files.delete_files([f"{base}/a.txt"])
    try:
        await files.get_file_info([f"{base}/a.txt"])
        check("fs: delete", False, "file still exists")
    except Exception as exc:  # noqa: BLE001
        check("fs: delete", "404" in str(exc) or "not found" in str(exc).lower(), exc)

    await files.delete_directories([f"{base}/moved"])
    listing = await files.list_directory(DirectoryListEntry(path=base, depth=1))
    check("fs: delete directories", [e.path for e in listing] == [f"{base}/sub"], listing)


async def main(port: int, workdir: str) -> int:
    config = ConnectionConfig(protocol="http", request_timeout=timedelta(seconds=30))
    endpoint = SandboxEndpoint(endpoint=f"127.0.0.1:{port}")
    health = HealthAdapter(config, endpoint)
    commands = CommandsAdapter(config, endpoint)
    files = FilesystemAdapter(config, endpoint)
    check("ping", await health.ping("warren") is True)
    for name, checks in (("commands", commands_checks(commands, workdir)), ("filesystem", filesystem_checks(files, workdir))):
        try:
            await checks
        except Exception:  # noqa: BLE001 - report and keep going
            traceback.print_exc()
            FAILURES.append(f"{name} raised")
    if FAILURES:
        print(f"{len(FAILURES)} failed: {', '.join(FAILURES)}")
        return 1
    print("all OpenSandbox SDK checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(int(sys.argv[1]), sys.argv[2])))
