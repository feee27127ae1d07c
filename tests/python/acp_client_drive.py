"""Drives an ACP agent with the ACP *client* of the PyPI `agent-client-protocol` package (a
third-party implementation), to show that Warren's shell agent speaks ACP as others do.

Usage: acp_client_drive.py WORKDIR AGENT_PROGRAM [AGENT_ARGS...]

The client offers the terminal capability (commands run locally with asyncio subprocesses),
answers every permission request with its first option, sends two prompts (`echo ...` and
`rm -f ...`) and prints one JSON line: {"turns": [{"stop_reason", "text"}...],
"permissions": n, "update_kinds": [...]}.
"""

import asyncio
import json
import sys
import uuid
from typing import Any

from acp import PROTOCOL_VERSION, text_block
from acp.interfaces import Agent
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    CreateTerminalResponse,
    KillTerminalResponse,
    ReleaseTerminalResponse,
    RequestPermissionResponse,
    TerminalExitStatus,
    TerminalOutputResponse,
    WaitForTerminalExitResponse,
)
from acp.stdio import spawn_agent_process


class Terminal:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.output = b""
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while chunk := await self.process.stdout.read(4096):
            self.output += chunk
        await self.process.wait()


class LocalClient:
    def __init__(self) -> None:
        self.text = ""
        self.permissions = 0
        self.update_kinds: list[str] = []
        self.terminals: dict[str, Terminal] = {}

    def on_connect(self, conn: Agent) -> None:
        pass

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.update_kinds.append(update.session_update)
        if update.session_update == "agent_message_chunk":
            self.text += getattr(update.content, "text", "")

    async def request_permission(self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any) -> RequestPermissionResponse:
        self.permissions += 1
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=options[0].option_id))

    async def create_terminal(self, session_id: str, command: str, args: list[str] | None = None, env: Any = None, cwd: str | None = None, output_byte_limit: int | None = None, **kwargs: Any) -> CreateTerminalResponse:
        process = await asyncio.create_subprocess_exec(
            command, *(args or []), cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        terminal_id = f"py-term-{uuid.uuid4().hex[:8]}"
        self.terminals[terminal_id] = Terminal(process)
        return CreateTerminalResponse(terminal_id=terminal_id)

    def _exit(self, terminal: Terminal) -> TerminalExitStatus | None:
        if not terminal.reader.done():
            return None
        return TerminalExitStatus(exit_code=terminal.process.returncode)

    async def terminal_output(self, session_id: str, terminal_id: str, **kwargs: Any) -> TerminalOutputResponse:
        terminal = self.terminals[terminal_id]
        return TerminalOutputResponse(output=terminal.output.decode(errors="replace"), truncated=False, exit_status=self._exit(terminal))

    async def wait_for_terminal_exit(self, session_id: str, terminal_id: str, **kwargs: Any) -> WaitForTerminalExitResponse:
        terminal = self.terminals[terminal_id]
        await terminal.reader
        return WaitForTerminalExitResponse(exit_code=terminal.process.returncode)

    async def kill_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> KillTerminalResponse:
        terminal = self.terminals[terminal_id]
        if terminal.process.returncode is None:
            terminal.process.kill()
        return KillTerminalResponse()

    async def release_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> ReleaseTerminalResponse:
        terminal = self.terminals.pop(terminal_id)
        if terminal.process.returncode is None:
            terminal.process.kill()
        return ReleaseTerminalResponse()


async def main() -> None:
    workdir, program, *args = sys.argv[1:]
    client = LocalClient()
    async with spawn_agent_process(client, program, *args) as (conn, _process):
        await conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities(terminal=True))
        session = await conn.new_session(cwd=workdir, mcp_servers=[])
        turns = []
        for prompt in ["echo from-python-client", "rm -f victim.txt"]:
            before = len(client.text)
            response = await conn.prompt(session_id=session.session_id, prompt=[text_block(prompt)])
            turns.append({"stop_reason": response.stop_reason, "text": client.text[before:]})
    print(json.dumps({"turns": turns, "permissions": client.permissions, "update_kinds": client.update_kinds}))


if __name__ == "__main__":
    asyncio.run(main())
