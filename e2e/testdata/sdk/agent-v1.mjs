// An agent on the official TypeScript SDK v1 (@modelcontextprotocol/sdk),
// as a client author would write it, driven by e2e.TestSDKClientsFinish.
// Usage: node agent-v1.mjs URL MODE, MCP_TOKEN in the environment.
//   plain: no tasks; the call's result names an approval handle, followed
//          with approval_status, and the same call again runs it.
//   tasks: the SDK's experimental tasks API (protocol 2025-11-25).
// It prints one JSON object per line: {"event":"pending","handle":...}
// once the request is made, then {"event":"result","result":...}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, mode] = process.argv.slice(2);
const say = (o) => console.log(JSON.stringify(o));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${process.env.MCP_TOKEN}` } },
});
const client = new Client({ name: "agent-v1", version: "1.0.0" }, { capabilities: mode === "tasks" ? { tasks: {} } : {} });
await client.connect(transport);
await client.listTools(); // as an agent does: the SDK learns which tools take tasks
const call = { name: "wire_transfer", arguments: { to: "acct-sdk", amount: Number(process.env.AMOUNT ?? 50000) } };

if (mode === "tasks") {
  for await (const m of client.experimental.tasks.callToolStream(call)) {
    if (m.type === "taskCreated") say({ event: "pending", handle: m.task.taskId });
    else if (m.type === "result") say({ event: "result", result: m.result });
    else if (m.type === "error") { say({ event: "error", error: String(m.error) }); process.exit(1); }
  }
} else {
  let r = await client.callTool(call);
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
