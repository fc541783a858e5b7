// An agent on the official TypeScript SDK v2 (@modelcontextprotocol/client),
// driven by e2e.TestSDKClientsFinish. Usage: node agent-v2.mjs URL MODE,
// MCP_TOKEN in the environment.
//   legacy: the SDK's default (protocol 2025-11-25), no tasks;
//   modern: pinned to 2026-07-28, no tasks;
//     both follow the approval handle with approval_status and call again.
//   tasks:  pinned to 2026-07-28 with the tasks extension declared. The SDK
//     rejects a CreateTaskResult (UNSUPPORTED_RESULT_TYPE) and loses the
//     task id; TaskTransport (below, docs/clients.md) is what a client
//     author adds: it hands the task to the agent and follows it with
//     tasks/get on the same transport.
// Output as agent-v1.mjs.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const [url, mode] = process.argv.slice(2);
const say = (o) => console.log(JSON.stringify(o));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const TASKS = "io.modelcontextprotocol/tasks";

// TaskTransport wraps a transport: a tools/call answered with a task
// (resultType "task") reaches the SDK as a complete tool error whose _meta
// carries the task, so callTool resolves; getTask sends tasks/get on the
// same transport and returns the task without involving the SDK.
function TaskTransport(inner) {
  const waiting = new Map();
  let n = 0, deliver;
  inner.onmessage = (m, extra) => {
    if (m.id !== undefined && waiting.has(m.id)) {
      const w = waiting.get(m.id);
      waiting.delete(m.id);
      return m.error ? w.reject(new Error(m.error.message)) : w.resolve(m.result);
    }
    if (m.result?.resultType === "task") {
      m = { ...m, result: { resultType: "complete", isError: true, _meta: { [TASKS]: m.result },
        content: [{ type: "text", text: `The server made task ${m.result.taskId}: ${m.result.statusMessage ?? ""}` }] } };
    }
    deliver?.(m, extra);
  };
  const t = new Proxy(inner, {
    get(target, prop) {
      if (prop === "onmessage") return deliver;
      const v = Reflect.get(target, prop);
      return typeof v === "function" ? v.bind(target) : v;
    },
    set(target, prop, value) {
      if (prop === "onmessage") deliver = value;
      else Reflect.set(target, prop, value);
      return true;
    },
  });
  t.getTask = (taskId) => new Promise((resolve, reject) => {
    const id = `task-get-${++n}`;
    waiting.set(id, { resolve, reject });
    inner.send({ jsonrpc: "2.0", id, method: "tasks/get", params: { taskId, _meta: {
      "io.modelcontextprotocol/protocolVersion": "2026-07-28",
      "io.modelcontextprotocol/clientCapabilities": { extensions: { [TASKS]: {} } } } } }).catch(reject);
  });
  return t;
}

const inner = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${process.env.MCP_TOKEN}` } },
});
const transport = mode === "tasks" ? TaskTransport(inner) : inner;
const opts = {};
if (mode !== "legacy") opts.versionNegotiation = { mode: { pin: "2026-07-28" } };
if (mode === "tasks") opts.capabilities = { extensions: { [TASKS]: {} } };
const client = new Client({ name: "agent-v2", version: "1.0.0" }, opts);
await client.connect(transport);
const call = { name: "wire_transfer", arguments: { to: "acct-sdk", amount: Number(process.env.AMOUNT ?? 50000) } };

let r = await client.callTool(call);
if (mode === "tasks") {
  const task = r._meta?.[TASKS];
  if (!task) { say({ event: "result", result: r }); process.exit(0); }
  say({ event: "pending", handle: task.taskId });
  for (;;) {
    const got = await transport.getTask(task.taskId);
    if (["completed", "failed", "cancelled"].includes(got.status)) { say({ event: "result", result: got.result ?? got }); break; }
    await sleep(Math.min(got.pollIntervalMs ?? 1000, 500));
  }
} else {
  const approval = r._meta?.["io.github.omcp/approval"];
  if (!approval) { say({ event: "result", result: r }); process.exit(0); }
  say({ event: "pending", handle: approval.handle });
  for (;;) {
    const s = await client.callTool({ name: approval.followWith, arguments: { handle: approval.handle } });
    const st = s.structuredContent;
    if (st.status === "approved") break;
    if (st.status !== "pending") { say({ event: "error", error: st }); process.exit(1); }
    await sleep(Math.min(st.pollIntervalMs, 500));
  }
  r = await client.callTool(call);
  say({ event: "result", result: r });
}
await client.close();
