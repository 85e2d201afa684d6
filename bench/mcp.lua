-- wrk script: MCP 2026-07-28 POSTs with the proper headers and body, and a JSON summary.
--
-- Environment:
--   MCP_METHOD  JSON-RPC method (default tools/list)
--   MCP_NAME    tool name for tools/call (sent as params.name and the Mcp-Name header)
--   MCP_ARGS    JSON object of tool arguments for tools/call (default {})
--   MCP_IDS     how many distinct JSON-RPC ids to cycle through (default 1000)
--   MCP_AUTHORIZATION  an Authorization header value for every request (default: none)
--
-- Only the JSON-RPC id varies between requests: nothing that is part of a cache key
-- (method, params, protocol version, client capabilities) changes. The requests are
-- rendered once in init(), so request() costs wrk almost nothing.
-- done() prints one line, "BENCH_JSON {...}", with latencies in microseconds.

local method = os.getenv("MCP_METHOD") or "tools/list"
local tool = os.getenv("MCP_NAME")
local tool_args = os.getenv("MCP_ARGS") or "{}"
local ids = tonumber(os.getenv("MCP_IDS") or "1000")
local version = "2026-07-28"
local authorization = os.getenv("MCP_AUTHORIZATION")

local ring = {}
local n = 0

function init(args)
  local headers = {
    ["Content-Type"] = "application/json",
    ["Accept"] = "application/json, text/event-stream",
    ["MCP-Protocol-Version"] = version,
    ["Mcp-Method"] = method,
  }
  if authorization then
    headers["Authorization"] = authorization
  end
  local params = ""
  if tool then
    headers["Mcp-Name"] = tool
    params = string.format('"name":"%s","arguments":%s,', tool, tool_args)
  end
  local meta = string.format(
    '"_meta":{"io.modelcontextprotocol/protocolVersion":"%s","io.modelcontextprotocol/clientCapabilities":{}}',
    version
  )
  for i = 1, ids do
    local body = string.format('{"jsonrpc":"2.0","id":%d,"method":"%s","params":{%s%s}}', i, method, params, meta)
    ring[i] = wrk.format("POST", nil, headers, body)
  end
end

function request()
  n = n % ids + 1
  return ring[n]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"mean":%.1f,"p50":%d,"p90":%d,"p99":%d,"p999":%d,"max":%d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max
  ))
end
