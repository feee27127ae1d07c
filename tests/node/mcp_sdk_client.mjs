// Drives Warren's exec tools with the official MCP TypeScript SDK, as a Node agent would.
//
// Usage:
//   node mcp_sdk_client.mjs stdio WARREN_BINARY WORKDIR
//   node mcp_sdk_client.mjs http URL TOKEN
//
// The SDK validates every structured result against the tool's outputSchema. The schemas are
// also compiled by strict draft-07 and 2020-12-only Ajv validators, as strict clients do. Exits
// non-zero naming each failed check.

import Ajv from "ajv";
import Ajv2020 from "ajv/dist/2020.js";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const failures = [];
const check = (name, condition, detail = "") => {
  if (!condition) failures.push(`${name}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
};
const textOf = (result) => result.content.filter((c) => c.type === "text").map((c) => c.text).join("\n");

const [mode, first, second] = process.argv.slice(2);
const transport =
  mode === "stdio"
    ? new StdioClientTransport({ command: first, args: ["mcp", "--workdir", second], env: { WARREN_LOG: "warn", PATH: process.env.PATH } })
    : new StreamableHTTPClientTransport(new URL(first), { requestInit: { headers: { "X-EXECD-ACCESS-TOKEN": second } } });
const client = new Client({ name: "warren-ts-check", version: "1.0.0" });
await client.connect(transport);

const { tools } = await client.listTools();
check("tool names", JSON.stringify(tools.map((t) => t.name).sort()) === JSON.stringify(["exec_command", "kill_session", "list_sessions", "write_stdin"]), tools.map((t) => t.name));
for (const [dialect, Validator] of [["draft-07", Ajv], ["2020-12", Ajv2020]]) {
  const ajv = new Validator({ strict: true, allErrors: true });
  for (const tool of tools) {
    for (const [kind, schema] of [["input", tool.inputSchema], ["output", tool.outputSchema]]) {
      try {
        if (schema) ajv.compile(schema);
      } catch (error) {
        check(`${tool.name} ${kind} schema compiles as ${dialect}`, false, String(error));
      }
    }
  }
}

const quick = await client.callTool({ name: "exec_command", arguments: { cmd: "echo from-node; exit 5" } });
check("quick: not an error", !quick.isError, textOf(quick));
check("quick: exit code", quick.structuredContent?.exit_code === 5, quick.structuredContent);
check("quick: output", quick.structuredContent?.output === "from-node\n", quick.structuredContent);
check("quick: codex text", textOf(quick).includes("Process exited with code 5"), textOf(quick));

const running = await client.callTool({ name: "exec_command", arguments: { cmd: "sleep 600", yield_time_ms: 250 } });
const sessionId = running.structuredContent?.session_id;
check("sleep: running", typeof sessionId === "number", running.structuredContent);
const listed = await client.callTool({ name: "list_sessions", arguments: {} });
check("list: has the session", (listed.structuredContent?.sessions ?? []).some((s) => s.session_id === sessionId), listed.structuredContent);
const killed = await client.callTool({ name: "kill_session", arguments: { session_id: sessionId } });
check("kill: exited", killed.structuredContent?.status === "exited", killed.structuredContent);

const unknown = await client.callTool({ name: "write_stdin", arguments: { session_id: 1 } });
check("unknown session: tool error", unknown.isError === true, unknown);
check("unknown session: message", textOf(unknown) === "write_stdin failed: Unknown process id 1", textOf(unknown));
const missing = await client.callTool({ name: "exec_command", arguments: {} });
check("missing cmd: tool error", missing.isError === true && textOf(missing).includes("missing field `cmd`"), textOf(missing));

await client.close();
if (failures.length > 0) {
  console.error(failures.join("\n"));
  process.exit(1);
}
console.log("all checks passed");
