"""An ACP agent built on the PyPI `agent-client-protocol` package (a third-party ACP
implementation), driven by Warren's brain tests to show that Warren's ACP client speaks the
protocol as others do.

Prompts:
  write PATH   -> fs/write_text_file PATH "hello from python", then says "wrote PATH"
  read PATH    -> fs/read_text_file PATH, says "read: CONTENT"
  caps         -> says what the client offered: "caps: fs.read=B fs.write=B terminal=B mcp=NAMES"
                  (B is true/false; NAMES the MCP servers given in session/new, comma-separated)
  term CMD     -> terminal/create bash -c CMD, wait_for_exit, terminal/output, release;
                  says "term: OUTPUT"
  perm         -> session/request_permission (allow / reject); says "permission: ID" or
                  ends the turn "cancelled"
  anything     -> says "echo: <text>"

Like a real agent, it never calls a client method the client did not offer in `initialize`
(fs.readTextFile, fs.writeTextFile, terminal): such a prompt fails with a JSON-RPC error.
"""

import asyncio
import uuid
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    RequestError,
    Agent,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    run_agent,
    text_block,
    update_agent_message,
)
from acp.interfaces import Client
from acp.schema import AllowedOutcome, PermissionOption, ToolCallUpdate


class EchoAgent(Agent):
    def __init__(self) -> None:
        self._conn: Client | None = None
        self._client_capabilities: Any = None
        self._mcp_servers: dict[str, list[Any]] = {}

    def on_connect(self, conn: Client) -> None:
        self._conn = conn

    async def initialize(self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None, **kwargs: Any) -> InitializeResponse:
        self._client_capabilities = client_capabilities
        return InitializeResponse(protocol_version=PROTOCOL_VERSION)

    async def new_session(self, cwd: str, mcp_servers: Any = None, **kwargs: Any) -> NewSessionResponse:
        session_id = f"py-{uuid.uuid4().hex}"
        self._mcp_servers[session_id] = list(mcp_servers or [])
        return NewSessionResponse(session_id=session_id)

    def _capabilities(self, session_id: str) -> str:
        caps = self._client_capabilities
        fs = getattr(caps, "fs", None)
        flag = lambda value: "true" if value else "false"
        names = ",".join(getattr(server, "name", "?") for server in self._mcp_servers.get(session_id, []))
        return (
            f"caps: fs.read={flag(getattr(fs, 'read_text_file', False))}"
            f" fs.write={flag(getattr(fs, 'write_text_file', False))}"
            f" terminal={flag(getattr(caps, 'terminal', False))} mcp={names}"
        )

    def _require(self, offered: bool, method: str) -> None:
        if not offered:
            raise RequestError.invalid_params({"reason": f"the client did not offer {method}"})

    async def _say(self, session_id: str, text: str) -> None:
        assert self._conn is not None
        await self._conn.session_update(session_id=session_id, update=update_agent_message(text_block(text)))

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        assert self._conn is not None
        text = "".join(getattr(block, "text", "") for block in prompt)
        caps = self._client_capabilities
        fs = getattr(caps, "fs", None)
        if text.startswith("write "):
            path = text[len("write "):]
            self._require(getattr(fs, "write_text_file", False), "fs/write_text_file")
            await self._conn.write_text_file(session_id=session_id, path=path, content="hello from python")
            await self._say(session_id, f"wrote {path}")
        elif text.startswith("read "):
            self._require(getattr(fs, "read_text_file", False), "fs/read_text_file")
            read = await self._conn.read_text_file(session_id=session_id, path=text[len("read "):])
            await self._say(session_id, f"read: {read.content}")
        elif text == "caps":
            await self._say(session_id, self._capabilities(session_id))
        elif text.startswith("term "):
            self._require(getattr(caps, "terminal", False), "terminal/create")
            created = await self._conn.create_terminal(session_id=session_id, command="bash", args=["-c", text[len("term "):]])
            await self._conn.wait_for_terminal_exit(session_id=session_id, terminal_id=created.terminal_id)
            output = await self._conn.terminal_output(session_id=session_id, terminal_id=created.terminal_id)
            await self._conn.release_terminal(session_id=session_id, terminal_id=created.terminal_id)
            await self._say(session_id, f"term: {output.output}")
        elif text == "perm":
            options = [
                PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
                PermissionOption(option_id="reject", name="Reject", kind="reject_once"),
            ]
            tool_call = ToolCallUpdate(tool_call_id="py-tool-1", title="python wants to act")
            answer = await self._conn.request_permission(session_id=session_id, tool_call=tool_call, options=options)
            if isinstance(answer.outcome, AllowedOutcome):
                await self._say(session_id, f"permission: {answer.outcome.option_id}")
            else:
                return PromptResponse(stop_reason="cancelled")
        else:
            await self._say(session_id, f"echo: {text}")
        return PromptResponse(stop_reason="end_turn")


async def main() -> None:
    await run_agent(EchoAgent())


if __name__ == "__main__":
    asyncio.run(main())
