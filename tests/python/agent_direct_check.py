"""Drives a real ACP agent (claude-agent-acp, codex-acp, gemini --acp) directly over stdio against
tests/python/fake_model.py, to find and prove the environment and config it needs offline.

Usage: agent_direct_check.py --agent claude|codex|gemini [--bwrap] [--keep] [--verbose]
         [--approval untrusted] [--sandbox danger-full-access] [--read-missing error|empty]

Needs scripts/agents-env.sh (installs the agents). Raw JSON-RPC (newline-delimited) over stdio.
Prints PASS/FAIL per check and a JSON summary line; exit status 1 if any check failed.
"""

import argparse
import json
import os
import queue
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOKEN = "wm_0123456789abcdef0123456789abcdef"
SHELL_CMD = "id; pwd; echo MARKER-$((6*7))"
# Gemini refuses any command containing "$(" (its command-substitution guard), so it gets a
# command whose text does not contain the marker either.
GEMINI_CMD = "id; pwd; echo MARKER-4''2"


def script(agent):
    return [{"shell": GEMINI_CMD if agent == "gemini" else SHELL_CMD}, {"text": "finished"},
            {"write": {"path": "notes.txt", "content": "hello from the model\n"}},
            {"text": "written"}, {"text": "resumed"}]


IN_HOME, IN_WS = "/home/agent", "/workspace"


def agents_bin():
    out = subprocess.run([os.path.join(ROOT, "scripts", "agents-env.sh")], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return out.strip()


def preset(agent, base, home, opts):
    """(argv, env, files) for an agent: files maps a path under HOME to its content."""
    env = {"PATH": None, "HOME": None, "LANG": "C.UTF-8", "TERM": "dumb", "USER": "agent"}
    files = {}
    if agent == "claude":
        argv = ["claude-agent-acp"]
        env.update(ANTHROPIC_BASE_URL=f"{base}/v1/model/anthropic", ANTHROPIC_API_KEY=TOKEN,
                   DISABLE_AUTOUPDATER="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
        env.update(opts.extra_env)
    elif agent == "codex":
        argv = ["codex-acp"]
        env.update(CODEX_HOME=f"{home}/.codex", WARREN_MODEL_TOKEN=TOKEN)
        env.update(opts.extra_env)
        files[".codex/config.toml"] = f"""\
model = "gpt-5.4"
model_provider = "warren"
approval_policy = "{opts.approval}"
sandbox_mode = "{opts.sandbox}"
check_for_update_on_startup = false

[model_providers.warren]
name = "Warren model proxy"
base_url = "{base}/v1/model/openai/v1"
wire_api = "responses"
env_key = "WARREN_MODEL_TOKEN"

[analytics]
enabled = false

[otel]
exporter = "none"
"""
    else:
        argv = ["gemini", "--acp"]
        env.update(GOOGLE_GEMINI_BASE_URL=f"{base}/v1/model/gemini", GEMINI_API_KEY=TOKEN)
        env.update(opts.extra_env)
        files[".gemini/settings.json"] = json.dumps({
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
        }, indent=2)
    return argv, env, files


class Agent:
    """One agent process and a JSON-RPC connection to it."""

    def __init__(self, argv, env, cwd, opts, host_ws, log):
        self.opts, self.host_ws, self.log = opts, host_ws, log
        self.t0 = time.monotonic()
        uid = opts.host_uid if opts.bwrap else None
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(log, "ab"), env=env, cwd=cwd,
                                     user=uid, group=uid, extra_groups=[] if uid else None,
                                     start_new_session=True)
        self.next_id, self.pending, self.lock = 0, {}, threading.Lock()
        self.updates, self.client_calls, self.permissions = [], [], []
        self.terminals = {}
        threading.Thread(target=self.reader, daemon=True).start()

    def host_path(self, path):
        if self.opts.bwrap and (path == IN_WS or path.startswith(IN_WS + "/")):
            return self.host_ws + path[len(IN_WS):]
        return path

    def send(self, msg):
        if self.opts.verbose:
            print(">>", json.dumps(msg)[:400], file=sys.stderr)
        with self.lock:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()

    def request(self, method, params, timeout=120):
        with self.lock:
            self.next_id += 1
            rid = self.next_id
            q = self.pending[rid] = queue.Queue()
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        try:
            msg = q.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"{method}: no answer in {timeout} s")
        if "error" in msg:
            raise RuntimeError(f"{method}: {msg['error']}")
        return msg["result"]

    def reader(self):
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                print("agent stdout (not JSON):", line[:200], file=sys.stderr)
                continue
            if self.opts.verbose:
                print("<<", json.dumps(msg)[:400], file=sys.stderr)
            if "method" in msg and "id" in msg:
                threading.Thread(target=self.serve, args=(msg,), daemon=True).start()
            elif "method" in msg:
                if msg["method"] == "session/update":
                    self.updates.append(msg["params"]["update"])
            else:
                q = self.pending.pop(msg.get("id"), None)
                if q:
                    q.put(msg)

    def serve(self, msg):
        method, p = msg["method"], msg.get("params") or {}
        self.client_calls.append({"method": method, "params": p})
        try:
            result = self.answer(method, p)
            self.send({"jsonrpc": "2.0", "id": msg["id"], "result": result})
        except Exception as e:  # noqa: BLE001 - answered as a JSON-RPC error
            self.send({"jsonrpc": "2.0", "id": msg["id"],
                       "error": {"code": -32603 if not isinstance(e, FileNotFoundError)
                                 else -32002, "message": str(e)}})

    def answer(self, method, p):
        if method == "session/request_permission":
            options = p.get("options") or []
            self.permissions.append({"title": (p.get("toolCall") or {}).get("title"),
                                     "options": [(o["optionId"], o["kind"]) for o in options]})
            pick = next((o for o in options if o["kind"] == "allow_once"), None) or \
                next((o for o in options if o["kind"] == "allow_always"), options[0])
            return {"outcome": {"outcome": "selected", "optionId": pick["optionId"]}}
        if method == "fs/read_text_file":
            path = self.host_path(p["path"])
            if not os.path.exists(path):
                if self.opts.read_missing == "empty":
                    return {"content": ""}
                raise FileNotFoundError(f"no such file: {p['path']}")
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if p.get("line") or p.get("limit"):
                lines = text.splitlines(keepends=True)
                start = max((p.get("line") or 1) - 1, 0)
                text = "".join(lines[start:start + p["limit"]] if p.get("limit") else lines[start:])
            return {"content": text}
        if method == "fs/write_text_file":
            path = self.host_path(p["path"])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(p["content"])
            return {}
        if method == "terminal/create":
            tid = f"term-{len(self.terminals) + 1}"
            cmd = [p["command"], *(p.get("args") or [])]
            proc = subprocess.Popen(cmd if p.get("args") else ["sh", "-c", p["command"]],
                                    cwd=self.host_path(p.get("cwd") or IN_WS),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            self.terminals[tid] = proc
            return {"terminalId": tid}
        if method == "terminal/output":
            proc = self.terminals[p["terminalId"]]
            out = proc.stdout.read() if proc.poll() is not None else b""
            return {"output": out.decode(errors="replace"), "truncated": False,
                    "exitStatus": {"exitCode": proc.returncode} if proc.returncode is not None
                    else None}
        if method == "terminal/wait_for_exit":
            return {"exitCode": self.terminals[p["terminalId"]].wait()}
        if method in ("terminal/kill", "terminal/release"):
            proc = self.terminals[p["terminalId"]]
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            return {}
        raise RuntimeError(f"method not handled: {method}")

    def rss_kb(self):
        """Total VmRSS of the agent's process tree."""
        children = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = open(f"/proc/{pid}/stat").read()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(pid))
            except (OSError, IndexError, ValueError):
                pass
        total, todo = 0, [self.proc.pid]
        while todo:
            pid = todo.pop()
            todo += children.get(pid, [])
            try:
                m = re.search(r"VmRSS:\s+(\d+)", open(f"/proc/{pid}/status").read())
                total += int(m.group(1)) if m else 0
            except OSError:
                pass
        return total

    def stop(self):
        """Closes stdin, then kills the agent's whole process group (its own session): the
        codex-acp node wrapper's native child does not exit on stdin EOF and would outlive it."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait()
        for t in self.terminals.values():
            if t.poll() is None:
                t.kill()
                t.wait()


def bwrap_argv(argv, env, home, ws, agents_dir):
    out = ["bwrap", "--unshare-user", "--unshare-cgroup-try", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
           "--uid", "1000", "--gid", "1000", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc",
           "/etc", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
           "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
           "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/home",
           "--bind", home, IN_HOME, "--bind", ws, IN_WS, "--ro-bind", agents_dir, agents_dir,
           "--chdir", IN_WS, "--die-with-parent", "--new-session", "--hostname", "warren",
           "--disable-userns", "--clearenv"]
    for k, v in env.items():
        out += ["--setenv", k, v]
    return out + ["--cap-drop", "ALL", "--", *argv]


class Checks:
    def __init__(self):
        self.results = []

    def check(self, name, ok, detail=""):
        self.results.append((name, bool(ok)))
        print(f"{'PASS' if ok else 'FAIL'} {name}" + (f" -- {detail}" if detail else ""),
              flush=True)
        return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", required=True, choices=["claude", "codex", "gemini"])
    ap.add_argument("--bwrap", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--approval", default="untrusted")
    ap.add_argument("--sandbox", default="danger-full-access")
    ap.add_argument("--read-missing", default="empty", choices=["error", "empty"],
                    help="answer to fs/read_text_file of a missing file (the gateway: empty)")
    ap.add_argument("--gemini-restore", default="rename", choices=["rename", "wait", "none"],
                    help="work around gemini-cli wiping a session loaded in the minute it was "
                    "recorded: rename its chat files first, or wait for the next minute")
    ap.add_argument("--env", action="append", default=[], help="extra NAME=VALUE for the agent")
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--restore", default="load", choices=["load", "resume"],
                    help="how the second process restores the session (load if advertised)")
    ap.add_argument("--prefix", default="", help="a command prefix, e.g. 'strace -f -o F'")
    ap.add_argument("--host-uid", type=int, help="with --bwrap: run bwrap as this host uid (as "
                    "a root gateway does) and chown the home and workspace to it")
    opts = ap.parse_args()
    opts.extra_env = dict(e.split("=", 1) for e in opts.env)
    bin_dir = agents_bin()
    agents_dir = os.path.dirname(os.path.dirname(bin_dir))
    tmp = tempfile.mkdtemp(prefix=f"agent-check-{opts.agent}-")
    home, ws = os.path.join(tmp, "home"), os.path.join(tmp, "ws")
    os.makedirs(home)
    os.makedirs(ws)
    script_path, log_path = os.path.join(tmp, "script.json"), os.path.join(tmp, "model.jsonl")
    json.dump(script(opts.agent), open(script_path, "w"))
    fake = subprocess.Popen([sys.executable, os.path.join(HERE, "fake_model.py"), "--port", "0",
                             "--log", log_path, "--script", script_path, "--key", TOKEN],
                            stdout=subprocess.PIPE,
                            text=True)
    port = int(fake.stdout.readline().strip().split("=")[1])
    base = f"http://127.0.0.1:{port}"
    c = Checks()
    agents = []
    summary = {"agent": opts.agent, "bwrap": opts.bwrap, "tmp": tmp}
    try:
        argv, env, files = preset(opts.agent, base, IN_HOME if opts.bwrap else home, opts)
        for rel, content in files.items():
            path = os.path.join(home, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(content)
        env["PATH"] = f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"
        env["HOME"] = IN_HOME if opts.bwrap else home
        summary["env"] = env
        cwd = IN_WS if opts.bwrap else ws
        if opts.bwrap:
            # Inside, uid 1000 is the uid bwrap runs as: the files must belong to that host uid.
            if opts.host_uid is not None:
                for d in (home, ws):
                    for dirpath, _, names in os.walk(d):
                        for n in [dirpath] + [os.path.join(dirpath, x) for x in names]:
                            os.chown(n, opts.host_uid, opts.host_uid)
            os.chmod(tmp, 0o755)
            full_argv, full_env, run_cwd = bwrap_argv(argv, env, home, ws, agents_dir), \
                {"PATH": os.environ["PATH"]}, tmp
        else:
            full_argv, full_env, run_cwd = [shutil.which(argv[0], path=env["PATH"]), *argv[1:]], \
                env, ws
        full_argv = shlex.split(opts.prefix) + full_argv
        summary["argv"] = full_argv
        stderr_log = os.path.join(tmp, "agent-stderr.log")

        def start():
            a = Agent(full_argv, full_env, run_cwd, opts, ws, stderr_log)
            agents.append(a)
            init = a.request("initialize", {"protocolVersion": 1, "clientCapabilities": {
                "fs": {"readTextFile": True, "writeTextFile": True}, "terminal": True},
                "clientInfo": {"name": "warren-check", "version": "0"}}, timeout=opts.timeout)
            ms = int((time.monotonic() - a.t0) * 1000)
            return a, init, ms

        a, init, ms = start()
        caps = init.get("agentCapabilities") or {}
        summary.update(init_ms=ms, rss_kb_after_init=a.rss_kb(), agent_capabilities=caps,
                       auth_methods=init.get("authMethods"))
        c.check("initialize", True, f"{ms} ms, rss {a.rss_kb()} kB")
        t = time.monotonic()
        new = a.request("session/new", {"cwd": cwd, "mcpServers": []}, timeout=opts.timeout)
        sid = new["sessionId"]
        summary["session_new_ms"] = int((time.monotonic() - t) * 1000)
        summary["modes"] = new.get("modes")
        c.check("session/new", sid, f"{summary['session_new_ms']} ms, id {sid}")

        def prompt(agent, text):
            t = time.monotonic()
            r = agent.request("session/prompt", {"sessionId": sid, "prompt": [
                {"type": "text", "text": text}]}, timeout=opts.timeout)
            return r.get("stopReason"), int((time.monotonic() - t) * 1000)

        def model_log():
            return json.load(urllib.request.urlopen(f"{base}/_fake/log"))

        stop, ms = prompt(a, "run the command")
        summary["rss_kb_after_turn"] = a.rss_kb()
        c.check("turn 1 ends end_turn", stop == "end_turn", f"{stop} in {ms} ms")
        log = model_log()
        after = [e for e in log if e.get("step") == 1]
        c.check("request after the tool call carries MARKER-42",
                after and "MARKER-42" in json.dumps(after[0]["body"]))
        out = re.search(r"uid=\d+\([^)]*\)[^\"\\]*", json.dumps(after[0]["body"])) if after else None
        summary["id_output"] = out.group(0) if out else None
        call = [e for e in log if e.get("step") == 0]
        summary["shell_call"] = call[0]["answer"] if call else None
        stop, ms = prompt(a, "write the file")
        c.check("turn 2 ends end_turn", stop == "end_turn", f"{stop} in {ms} ms")
        target = os.path.join(ws, "notes.txt")
        landed = os.path.exists(target) and open(target).read() == "hello from the model\n"
        via_acp = any(x["method"] == "fs/write_text_file" for x in a.client_calls)
        c.check("write lands in the workspace", landed,
                "via ACP fs/write_text_file" if via_acp else "directly (no fs/write_text_file)")
        summary["write_call"] = next((e["answer"] for e in model_log() if e.get("step") == 2), None)
        if landed:
            st = os.stat(target)
            summary["notes_owner"] = f"{st.st_uid}:{st.st_gid}"
        summary["client_methods_session1"] = sorted({x["method"] for x in a.client_calls})
        summary["fs_reads"] = [x["params"]["path"] for x in a.client_calls
                               if x["method"] == "fs/read_text_file"]
        summary["permissions_session1"] = a.permissions
        c.check("no ACP terminal/* used",
                not any(x["method"].startswith("terminal/") for x in a.client_calls))
        a.stop()

        # A new process with the same HOME: load or resume the first session.
        if opts.agent == "gemini":
            gemini_restore_fix(opts.gemini_restore, home, sid)
        a, init, ms = start()
        caps = init.get("agentCapabilities") or {}
        sess_caps = caps.get("sessionCapabilities") or {}
        method = "session/load" if caps.get("loadSession") else \
            "session/resume" if "resume" in sess_caps else None
        if opts.restore == "resume":
            method = "session/resume" if "resume" in sess_caps else None
        summary["restore_method"] = method
        if method is None:
            c.check("agent advertises session/load or session/resume", False, json.dumps(caps))
        else:
            before = len(a.updates)
            a.request(method, {"sessionId": sid, "cwd": cwd, "mcpServers": []},
                      timeout=opts.timeout)
            summary["replayed_updates"] = len(a.updates) - before
            c.check(f"{method} of the first session", True,
                    f"{summary['replayed_updates']} updates replayed")
            stop, ms = prompt(a, "what did we do before?")
            c.check("turn 3 (after restore) ends end_turn", stop == "end_turn", f"{stop}")
            last = [e for e in model_log() if e.get("step") == 4]
            c.check("restored turn's model request carries the earlier conversation",
                    last and "MARKER-42" in json.dumps(last[0]["body"]))
        summary["permissions_session2"] = a.permissions
        a.stop()
        log = model_log()
        summary["requests"] = [f"{e['method']} {e['path']}"
                               f"{'?' + '&'.join(e['query']) if e['query'] else ''}"
                               f" [{e.get('kind', e.get('status', ''))}]" for e in log]
        summary["tools_declared"] = sorted({n for e in log if e.get("kind") == "main"
                                            for n in tool_names(e["body"])})
        summary["home_files"] = sorted(os.path.relpath(os.path.join(d, n), home)
                                       for d, _, ns in os.walk(home) for n in ns)[:60]
    except Exception as e:  # noqa: BLE001 - reported as a failed check
        c.check("run", False, repr(e))
    finally:
        for a in agents:
            a.stop()
        fake.kill()
        fake.wait()
    print(json.dumps(summary, indent=1))
    try:
        print("--- agent stderr (tail) ---\n" + open(os.path.join(tmp, "agent-stderr.log"),
                                                      errors="replace").read()[-3000:])
    except OSError:
        pass
    if not opts.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    failed = [n for n, ok in c.results if not ok]
    print("RESULT", "FAIL " + ", ".join(failed) if failed else "PASS", flush=True)
    return 1 if failed else 0


def gemini_restore_fix(how, home, sid):
    """gemini-cli 0.61.0's session/load first starts a new recording for the same session id in
    chats/session-<UTC minute>-<id[:8]>.jsonl; if that is the file the session was recorded in
    (same minute), the `$set messages` it writes wipes the history and the load then fails with
    "No previous sessions found for this project." Renaming the recorded files (any name
    session-*.jsonl is listed) or waiting for the next minute avoids the collision."""
    if how == "wait":
        minute = time.strftime("%Y-%m-%dT%H-%M", time.gmtime())
        while time.strftime("%Y-%m-%dT%H-%M", time.gmtime()) == minute:
            time.sleep(0.5)
    elif how == "rename":
        for d, _, names in os.walk(os.path.join(home, ".gemini", "tmp")):
            for n in names:
                if n.startswith("session-") and n.endswith(f"-{sid[:8]}.jsonl"):
                    os.rename(os.path.join(d, n), os.path.join(d, f"session-restored-{n[8:]}"))


def tool_names(body):
    if not isinstance(body, dict):
        return []
    names = []
    for t in body.get("tools") or []:
        names += [d.get("name") for d in t.get("functionDeclarations") or []] or \
            [t.get("name") or (t.get("function") or {}).get("name") or t.get("type")]
    return names


if __name__ == "__main__":
    sys.exit(main())
