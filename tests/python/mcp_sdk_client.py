"""Drives Warren's exec tools with the official MCP Python SDK, as a Python agent would.

Usage:
    mcp_sdk_client.py stdio WARREN_BINARY WORKDIR
    mcp_sdk_client.py http URL TOKEN

Runs the same checks over either transport and exits non-zero naming each failed check. The SDK
validates every structured result against the tool's outputSchema, so a schema the SDK cannot use
fails here too.
"""

import asyncio
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

failures: list[str] = []


def check(name: str, condition: bool, detail: object = "") -> None:
    if not condition:
        failures.append(f"{name}: {detail}")


def text_of(result) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def exercise(session: ClientSession) -> None:
    await session.initialize()

    tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    check("tool names", sorted(tools) == ["exec_command", "kill_session", "list_sessions", "write_stdin"], sorted(tools))
    exec_schema = tools["exec_command"].input_schema if "exec_command" in tools else {}
    check("exec_command requires cmd", exec_schema.get("required") == ["cmd"], exec_schema)

    quick = await session.call_tool("exec_command", {"cmd": "echo from-python; exit 7"})
    data = quick.structured_content or {}
    check("quick: not an error", not quick.is_error, text_of(quick))
    check("quick: exit code", data.get("exit_code") == 7, data)
    check("quick: output", data.get("output") == "from-python\n", data)
    check("quick: codex text", "Process exited with code 7" in text_of(quick), text_of(quick))

    prompt = await session.call_tool("exec_command", {"cmd": "printf 'Continue? '; read -r answer; echo \"got $answer\""})
    data = prompt.structured_content or {}
    check("prompt: awaiting input", data.get("status") == "awaiting_input", data)
    session_id = data.get("session_id")
    if session_id is not None:
        answered = await session.call_tool(
            "write_stdin", {"session_id": session_id, "chars": "yes\n", "yield_time_ms": 10000}
        )
        output = (answered.structured_content or {}).get("output", "")
        check("prompt: answered", "got yes" in output, answered.structured_content)

    running = await session.call_tool("exec_command", {"cmd": "sleep 600", "yield_time_ms": 250})
    session_id = (running.structured_content or {}).get("session_id")
    check("sleep: running", session_id is not None, running.structured_content)
    listed = await session.call_tool("list_sessions", {})
    ids = [s["session_id"] for s in (listed.structured_content or {}).get("sessions", [])]
    check("list: has the session", session_id in ids, listed.structured_content)
    killed = await session.call_tool("kill_session", {"session_id": session_id})
    check("kill: exited", (killed.structured_content or {}).get("status") == "exited", killed.structured_content)

    unknown = await session.call_tool("write_stdin", {"session_id": 1})
    check("unknown session: tool error", unknown.is_error, unknown)
    check("unknown session: message", text_of(unknown) == "write_stdin failed: Unknown process id 1", text_of(unknown))
    missing = await session.call_tool("exec_command", {})
    check("missing cmd: tool error", missing.is_error and "missing field `cmd`" in text_of(missing), text_of(missing))


async def main() -> None:
    mode = sys.argv[1]
    if mode == "stdio":
        binary, workdir = sys.argv[2], sys.argv[3]
        params = StdioServerParameters(command=binary, args=["mcp", "--workdir", workdir], env={"WARREN_LOG": "warn"})
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await exercise(session)
    elif mode == "http":
        url, token = sys.argv[2], sys.argv[3]
        http = create_mcp_http_client(headers={"X-EXECD-ACCESS-TOKEN": token})
        async with http:
            async with streamable_http_client(url, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await exercise(session)
    else:
        raise SystemExit(f"unknown mode {mode}")


asyncio.run(main())
if failures:
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1)
print("all checks passed")
