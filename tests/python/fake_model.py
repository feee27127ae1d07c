"""A fake model server speaking the Anthropic Messages, OpenAI Responses/Chat Completions and
Gemini generateContent APIs (streaming SSE and not), answering from a script. Stdlib only.

Usage: fake_model.py --port 0 --log LOG.jsonl --script SCRIPT.json [--gate] [--key KEY]
Prints one line `PORT=<n>` once listening.

The script is a JSON list of steps, consumed in order by *main* requests (those that declare
tools); side requests (titles, next-speaker and loop checks, quota probes) get canned answers and
do not advance it. Steps:
  {"shell": "<command>"}                     -> a call of the agent's own shell tool
  {"write": {"path": "f.txt", "content": "..."}} -> a call of the agent's own file-write tool
  {"text": "..."}                            -> a final text answer
Any step may carry "gate": true. When the script is exhausted the answer is the text "done".

The fake is as strict as the real services: a step the request cannot carry out is refused, never
carried out some other way. A "shell" step with no shell tool among the request's tools, or a
"write" step with no file tool (Claude's Write, Gemini's write_file, Codex's apply_patch), is
answered 400 in the provider's error shape and logged with "refused" (a model without a file tool
cannot write a file, and a test must not pass as if it could). A body that is not JSON is 400
too, and with --key every model request must carry that key where the provider's API takes it
(x-api-key or a bearer token, `x-goog-api-key` or `?key=`), else 401.
Step i answers usage input 100+i, output 20+i, cache read 7, cache write 3 (side requests:
11, 2, 0, 0). Any path prefix before /v1/messages, /v1/responses, /v1/chat/completions,
/v1/models or /v1beta/models/... is ignored.

Control routes: GET /_fake/log (the log as a JSON list), POST /_fake/release (lets one gated
response continue; gated responses wait at most 30 s), POST /_fake/script (replaces the script
and restarts it at step 0).
"""

import argparse
import gzip
import json
import re
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

NOT_JSON = object()  # a body that did not parse: every API answers it 400
SIDE_USAGE = {"input": 11, "output": 2, "cache_read": 0, "cache_write": 0}
CWD_PATTERNS = [
    r"<cwd>([^<]+)</cwd>",
    r"[Ww]orking directory: (/[^\s\"\\]+)",
    r"working in the directory:? ?[\"']?(/[^\s\"'\\]+)",
    r"Current working directory[^/]*(/[^\s\"'\\]+)",
    r"Workspace Directories:\*\*\\n\s*- (/[^\s\"\\]+)",
]


class State:
    def __init__(self, script, log_path, gate_all, key):
        self.lock = threading.Lock()
        self.key = key
        self.script = script
        self.next_step = 0
        self.log = []
        self.log_file = open(log_path, "a", encoding="utf-8") if log_path else None
        self.gate_all = gate_all
        self.releases = threading.Semaphore(0)

    def take_step(self):
        """The next step of the script and its index (a "done" text when exhausted)."""
        with self.lock:
            i = self.next_step
            self.next_step += 1
            step = self.script[i] if i < len(self.script) else {"text": "done"}
        usage = {"input": 100 + i, "output": 20 + i, "cache_read": 7, "cache_write": 3}
        return i, step, usage

    def record(self, entry):
        with self.lock:
            self.log.append(entry)
            if self.log_file:
                self.log_file.write(json.dumps(entry) + "\n")
                self.log_file.flush()

    def wait_gate(self, step):
        if step.get("gate") or self.gate_all:
            self.releases.acquire(timeout=30)


def find_cwd(body):
    text = json.dumps(body) if not isinstance(body, str) else body
    for pattern in CWD_PATTERNS:
        m = re.search(pattern, text)
        if m:
            return m.group(1).rstrip(".").replace("\\n", "")
    return None


def abs_path(body, path):
    if path.startswith("/"):
        return path
    cwd = find_cwd(body)
    return f"{cwd.rstrip('/')}/{path}" if cwd else path


def schema_value(schema):
    """A value conforming to a (JSON or Gemini) schema: for JSON side requests."""
    if not isinstance(schema, dict):
        return "ok"
    kind = str(schema.get("type", "object")).lower()
    if "enum" in schema:
        enum = schema["enum"]
        return "user" if "user" in enum else enum[0]
    if kind == "object":
        return {k: schema_value(v) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        return []
    if kind == "integer":  # e.g. Gemini's router complexity_score must be >= 1
        return schema.get("minimum", 1)
    if kind == "number":  # e.g. Gemini's loop-check confidence: 0 = no loop
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    return "ok"


def shell_args(name, params, command):
    """Arguments for a shell-like tool, shaped after its declared parameters."""
    props = (params or {}).get("properties") or {}
    if "cmd" in props:  # Codex exec_command
        return {"cmd": command}
    if (props.get("command") or {}).get("type") == "array":  # Codex shell
        return {"command": ["bash", "-lc", command]}
    args = {"command": command}
    if "description" in props:
        args["description"] = "Run the requested command"
    return args


class Refused(Exception):
    """A request the real service would refuse, or a step this request cannot carry out."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


class Provider:
    """Turns a step into a list of (kind, payload) items and renders them per API."""

    def error_body(self, status, message):
        raise NotImplementedError

    def has_key(self, headers, query, key):
        raise NotImplementedError

    def __init__(self, handler, body):
        self.h = handler
        self.body = body if isinstance(body, dict) else {}

    def tools(self):  # {name: params schema}
        raise NotImplementedError

    def plan(self, step):
        """[("text", str)] or [("call", name, args)] or [("custom", name, input)]."""
        tools = self.tools()
        if "shell" in step:
            for name in ("Bash", "run_shell_command", "exec_command", "shell_command", "shell",
                         "local_shell"):
                if name in tools:
                    return [("call", name, shell_args(name, tools[name], step["shell"]))]
            raise Refused(400, f"fake model: the step runs a shell command, but the request "
                               f"offers no shell tool (tools: {sorted(tools)})")
        if "write" in step:
            path, content = step["write"]["path"], step["write"]["content"]
            if "Write" in tools:
                return [("call", "Write", {"file_path": abs_path(self.body, path),
                                           "content": content})]
            if "write_file" in tools:
                return [("call", "write_file", {"file_path": abs_path(self.body, path),
                                                "content": content})]
            if "apply_patch" in tools:
                # apply_patch ends every added line with a newline, as the content's own lines.
                lines = "".join(f"+{line}\n" for line in content.splitlines())
                patch = f"*** Begin Patch\n*** Add File: {path}\n{lines}*** End Patch\n"
                if tools["apply_patch"] == "custom":
                    return [("custom", "apply_patch", patch)]
                return [("call", "apply_patch", {"input": patch})]
            raise Refused(400, f"fake model: the step writes {path}, but the request offers no "
                               f"file tool (tools: {sorted(tools)})")
        return [("text", step.get("text", "done"))]


class Anthropic(Provider):
    def error_body(self, status, message):
        kind = "authentication_error" if status == 401 else "invalid_request_error"
        return {"type": "error", "error": {"type": kind, "message": message}}

    def has_key(self, headers, query, key):
        return headers.get("x-api-key") == key or headers.get("authorization") == f"Bearer {key}"

    def tools(self):
        return {t.get("name"): t.get("input_schema") for t in self.body.get("tools") or []}

    def side_text(self):
        text = json.dumps(self.body)
        if "policy_spec" in text:
            return "none"
        if "isNewTopic" in text:
            return '{"isNewTopic": false, "title": null}'
        return "ok"

    def respond(self, items, usage, gate):
        model = self.body.get("model", "claude-fake")
        mid = "msg_" + uuid.uuid4().hex[:20]
        u_start = {"input_tokens": usage["input"], "output_tokens": 1,
                   "cache_creation_input_tokens": usage["cache_write"],
                   "cache_read_input_tokens": usage["cache_read"]}
        content, stop = [], "end_turn"
        for item in items:
            if item[0] == "text":
                content.append({"type": "text", "text": item[1]})
            else:
                content.append({"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:20],
                                "name": item[1], "input": item[2]})
                stop = "tool_use"
        message = {"id": mid, "type": "message", "role": "assistant", "model": model,
                   "content": [], "stop_reason": None, "stop_sequence": None, "usage": u_start}
        if not self.body.get("stream"):
            u_end = dict(u_start, output_tokens=usage["output"])
            return self.h.send_json(dict(message, content=content, stop_reason=stop, usage=u_end))
        sse = self.h.start_sse()
        sse("message_start", {"type": "message_start", "message": message})
        gate()
        for i, block in enumerate(content):
            start = dict(block, **({"text": ""} if block["type"] == "text" else {"input": {}}))
            sse("content_block_start", {"type": "content_block_start", "index": i,
                                        "content_block": start})
            if block["type"] == "text":
                delta = {"type": "text_delta", "text": block["text"]}
            else:
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})
            sse("content_block_stop", {"type": "content_block_stop", "index": i})
        sse("message_delta", {"type": "message_delta",
                              "delta": {"stop_reason": stop, "stop_sequence": None},
                              "usage": dict(u_start, output_tokens=usage["output"])})
        sse("message_stop", {"type": "message_stop"})
        self.h.end_sse()


def openai_error(status, message):
    kind = "invalid_api_key" if status == 401 else None
    return {"error": {"message": message, "type": "invalid_request_error", "param": None,
                      "code": kind}}


def bearer(headers, key):
    return headers.get("authorization") == f"Bearer {key}"


class OpenAIResponses(Provider):
    def error_body(self, status, message):
        return openai_error(status, message)

    def has_key(self, headers, query, key):
        return bearer(headers, key)

    def tools(self):
        out = {}
        for t in self.body.get("tools") or []:
            if t.get("type") == "function":
                out[t.get("name")] = t.get("parameters")
            elif t.get("type") == "custom":
                out[t.get("name")] = "custom"
            elif t.get("type") == "local_shell":
                out["local_shell"] = None
        return out

    def respond(self, items, usage, gate):
        rid = "resp_" + uuid.uuid4().hex[:20]
        model = self.body.get("model", "gpt-fake")
        output = []
        for item in items:
            iid = uuid.uuid4().hex[:20]
            if item[0] == "text":
                output.append({"type": "message", "id": "msg_" + iid, "role": "assistant",
                               "status": "completed", "content": [
                                   {"type": "output_text", "text": item[1], "annotations": []}]})
            elif item[0] == "custom":
                output.append({"type": "custom_tool_call", "id": "ctc_" + iid, "status":
                               "completed", "call_id": "call_" + iid, "name": item[1],
                               "input": item[2]})
            else:
                output.append({"type": "function_call", "id": "fc_" + iid, "status": "completed",
                               "call_id": "call_" + iid, "name": item[1],
                               "arguments": json.dumps(item[2])})
        u = {"input_tokens": usage["input"],
             "input_tokens_details": {"cached_tokens": usage["cache_read"]},
             "output_tokens": usage["output"],
             "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": usage["input"] + usage["output"]}
        resp = {"id": rid, "object": "response", "created_at": 0, "model": model,
                "status": "in_progress", "output": [], "usage": None}
        if not self.body.get("stream"):
            return self.h.send_json(dict(resp, status="completed", output=output, usage=u))
        sse = self.h.start_sse()
        seq = iter(range(10**6))
        ev = lambda t, **kw: sse(t, dict(type=t, sequence_number=next(seq), **kw))  # noqa: E731
        ev("response.created", response=resp)
        gate()
        ev("response.in_progress", response=resp)
        for n, item in enumerate(output):
            if item["type"] == "message":
                text = item["content"][0]["text"]
                ev("response.output_item.added", output_index=n,
                   item=dict(item, status="in_progress", content=[]))
                part = {"type": "output_text", "text": "", "annotations": []}
                ev("response.content_part.added", item_id=item["id"], output_index=n,
                   content_index=0, part=part)
                ev("response.output_text.delta", item_id=item["id"], output_index=n,
                   content_index=0, delta=text)
                ev("response.output_text.done", item_id=item["id"], output_index=n,
                   content_index=0, text=text)
                ev("response.content_part.done", item_id=item["id"], output_index=n,
                   content_index=0, part=dict(part, text=text))
            elif item["type"] == "function_call":
                ev("response.output_item.added", output_index=n,
                   item=dict(item, status="in_progress", arguments=""))
                ev("response.function_call_arguments.delta", item_id=item["id"],
                   output_index=n, delta=item["arguments"])
                ev("response.function_call_arguments.done", item_id=item["id"],
                   output_index=n, arguments=item["arguments"])
            else:
                ev("response.output_item.added", output_index=n,
                   item=dict(item, status="in_progress", input=""))
                ev("response.custom_tool_call_input.delta", item_id=item["id"],
                   output_index=n, delta=item["input"])
                ev("response.custom_tool_call_input.done", item_id=item["id"],
                   output_index=n, input=item["input"])
            ev("response.output_item.done", output_index=n, item=item)
        ev("response.completed", response=dict(resp, status="completed", output=output, usage=u))
        self.h.end_sse()


class OpenAIChat(Provider):
    def error_body(self, status, message):
        return openai_error(status, message)

    def has_key(self, headers, query, key):
        return bearer(headers, key)

    def tools(self):
        return {t["function"]["name"]: t["function"].get("parameters")
                for t in self.body.get("tools") or [] if t.get("type") == "function"}

    def respond(self, items, usage, gate):
        cid = "chatcmpl-" + uuid.uuid4().hex[:20]
        model = self.body.get("model", "gpt-fake")
        u = {"prompt_tokens": usage["input"], "completion_tokens": usage["output"],
             "total_tokens": usage["input"] + usage["output"],
             "prompt_tokens_details": {"cached_tokens": usage["cache_read"]}}
        msg, finish = {"role": "assistant", "content": None}, "stop"
        for item in items:
            if item[0] == "text":
                msg["content"] = item[1]
            else:
                args = item[2] if item[0] == "call" else {"input": item[2]}
                msg.setdefault("tool_calls", []).append(
                    {"id": "call_" + uuid.uuid4().hex[:20], "type": "function",
                     "function": {"name": item[1], "arguments": json.dumps(args)}})
                finish = "tool_calls"
        base = {"id": cid, "object": "chat.completion", "created": 0, "model": model}
        if not self.body.get("stream"):
            return self.h.send_json(dict(base, usage=u, choices=[
                {"index": 0, "message": msg, "finish_reason": finish}]))
        sse = self.h.start_sse()
        chunk = lambda delta, fin=None: dict(base, object="chat.completion.chunk", choices=[  # noqa
            {"index": 0, "delta": delta, "finish_reason": fin}])
        sse(None, chunk({"role": "assistant", "content": ""}))
        gate()
        if msg["content"]:
            sse(None, chunk({"content": msg["content"]}))
        for n, call in enumerate(msg.get("tool_calls", [])):
            sse(None, chunk({"tool_calls": [dict(call, index=n)]}))
        sse(None, chunk({}, finish))
        sse(None, dict(base, object="chat.completion.chunk", choices=[], usage=u))
        self.h.send_raw(b"data: [DONE]\n\n")
        self.h.end_sse()


class Gemini(Provider):
    def error_body(self, status, message):
        kind = "UNAUTHENTICATED" if status == 401 else "INVALID_ARGUMENT"
        return {"error": {"code": status, "message": message, "status": kind}}

    def has_key(self, headers, query, key):
        return headers.get("x-goog-api-key") == key or query.get("key") == [key]

    def tools(self):
        return {d.get("name"): d.get("parameters") or d.get("parametersJsonSchema")
                for t in self.body.get("tools") or [] for d in t.get("functionDeclarations") or []}

    def side_text(self):
        config = self.body.get("generationConfig") or {}
        schema = config.get("responseJsonSchema") or config.get("responseSchema")
        if schema or config.get("responseMimeType") == "application/json":
            return json.dumps(schema_value(schema))
        return "ok"

    def respond(self, items, usage, gate, stream):
        model = self.h.gemini_model
        parts = [{"text": item[1]} if item[0] == "text" else
                 {"functionCall": {"name": item[1], "args": item[2]}} for item in items]
        um = {"promptTokenCount": usage["input"], "candidatesTokenCount": usage["output"],
              "cachedContentTokenCount": usage["cache_read"],
              "totalTokenCount": usage["input"] + usage["output"]}
        full = {"candidates": [{"content": {"role": "model", "parts": parts},
                                "finishReason": "STOP", "index": 0}],
                "usageMetadata": um, "modelVersion": model,
                "responseId": uuid.uuid4().hex[:20]}
        if not stream:
            return self.h.send_json(full)
        sse = self.h.start_sse()
        first = {"candidates": [{"content": {"role": "model", "parts": [{"text": ""}]},
                                 "index": 0}],
                 "usageMetadata": {"promptTokenCount": usage["input"],
                                   "totalTokenCount": usage["input"]}, "modelVersion": model}
        if parts and "text" in parts[0]:  # stream the text in two pieces
            text = parts[0]["text"]
            first["candidates"][0]["content"]["parts"] = [{"text": text[: len(text) // 2]}]
            full["candidates"][0]["content"]["parts"] = [{"text": text[len(text) // 2:]}]
        sse(None, first)
        gate()
        sse(None, full)
        self.h.end_sse()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: State = None  # set by main()

    def log_message(self, fmt, *args):  # keep stderr quiet
        pass

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                raw += self.rfile.read(size)
                self.rfile.readline()
        else:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding", "").lower() == "gzip":
            raw = gzip.decompress(raw)
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return NOT_JSON

    def send_json(self, obj, status=200):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def start_sse(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def sse(event, data):
            head = f"event: {event}\n" if event else ""
            self.send_raw(f"{head}data: {json.dumps(data)}\n\n".encode())
        return sse

    def send_raw(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_sse(self):
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def handle_any(self, method):
        url = urlsplit(self.path)
        path, query = url.path, parse_qs(url.query)
        body = self.read_body() if method == "POST" else None
        self.body_not_json = body is NOT_JSON
        entry = {"method": method, "path": path, "query": query,
                 "headers": dict(self.headers.items()),
                 "body": "<not JSON>" if self.body_not_json else body}
        if self.body_not_json:
            body = None
        st = self.state
        if path == "/_fake/log":
            return self.send_json(st.log)
        if path == "/_fake/release":
            st.releases.release()
            return self.send_json({"released": True})
        if path == "/_fake/script":
            with st.lock:
                st.script, st.next_step = body or [], 0
            return self.send_json({"steps": len(st.script)})
        gem = re.search(r"/v1(?:beta|alpha)?/models/([^/:]+):(\w+)$", path)
        if re.search(r"/v1/messages/count_tokens$", path):
            entry["provider"] = "anthropic"
            st.record(entry)
            return self.send_json({"input_tokens": 42})
        if re.search(r"/v1/messages$", path):
            return self.converse(Anthropic(self, body), entry, "anthropic")
        if re.search(r"/v1/responses$", path):
            return self.converse(OpenAIResponses(self, body), entry, "openai")
        if re.search(r"/v1/chat/completions$", path):
            return self.converse(OpenAIChat(self, body), entry, "openai")
        if gem and gem.group(2) == "countTokens":
            entry["provider"] = "gemini"
            st.record(entry)
            return self.send_json({"totalTokens": 42})
        if gem and gem.group(2) in ("streamGenerateContent", "generateContent"):
            self.gemini_model = gem.group(1)
            return self.converse(Gemini(self, body), entry, "gemini",
                                 stream=gem.group(2) == "streamGenerateContent")
        if method == "GET" and re.search(r"/v1(beta)?/models$", path):
            st.record(entry)
            return self.send_json({"object": "list", "data": [
                {"id": "gpt-fake", "object": "model", "created": 0, "owned_by": "fake"}],
                "models": []})
        entry["status"] = 404
        st.record(entry)
        return self.send_json({"error": {"type": "not_found", "message": f"no route {path}"}},
                              404)

    def refuse(self, provider, entry, refused):
        entry.update(status=refused.status, refused=refused.message)
        self.state.record(entry)
        self.send_json(provider.error_body(refused.status, refused.message), refused.status)

    def converse(self, provider, entry, name, **kw):
        st = self.state
        entry["provider"] = name
        headers = {k.lower(): v for k, v in self.headers.items()}
        if st.key is not None and not provider.has_key(headers, entry["query"], st.key):
            return self.refuse(provider, entry, Refused(401, "fake model: no valid API key"))
        if self.body_not_json:
            return self.refuse(provider, entry, Refused(400, "fake model: the body is not JSON"))
        if provider.tools():
            i, step, usage = st.take_step()
            try:
                items = provider.plan(step)
            except Refused as refused:
                entry.update(step=i, kind="main", usage=usage)
                return self.refuse(provider, entry, refused)
        else:
            i, step, usage = None, {}, SIDE_USAGE
            items = [("text", getattr(provider, "side_text", lambda: "ok")())]
        entry.update(step=i, kind="main" if i is not None else "side", usage=usage,
                     answer=[list(x) for x in items])
        st.record(entry)
        gate = lambda: st.wait_gate(step)  # noqa: E731
        try:
            provider.respond(items, usage, gate, **kw)
        except (BrokenPipeError, ConnectionResetError):
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--log")
    ap.add_argument("--script")
    ap.add_argument("--gate", action="store_true", help="gate every response")
    ap.add_argument("--key", help="the API key every model request must carry")
    args = ap.parse_args()
    script = json.load(open(args.script)) if args.script else []
    Handler.state = State(script, args.log, args.gate, args.key)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"PORT={server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
