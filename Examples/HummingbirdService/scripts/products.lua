-- wrk script for the example service: GET /products/ID with ID uniform over 0 ..< KEYS (environment,
-- default 1000), each wrk thread with its own random sequence; with WARM=1 each thread walks every ID in
-- turn instead (from its own offset), so that a warm-up of KEYS requests per thread asks for every key;
-- prints one RESULT line at the end that scripts/bench-service.sh parses (latencies in microseconds;
-- non2xx counts error responses).
local threads = {}
local keys = tonumber(os.getenv("KEYS") or "1000")
local warm = os.getenv("WARM") == "1"
local walked = 0

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  math.randomseed(os.time() * 1000 + (tid or 0) * 7919 + tonumber(os.getenv("SEED") or "0"))
end

function request()
  if warm then
    walked = walked + 1
    return wrk.format("GET", "/products/" .. ((walked + (tid or 0) * 7919) % keys))
  end
  return wrk.format("GET", "/products/" .. math.random(0, keys - 1))
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d p999_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency:percentile(99.9),
    e.status, e.connect, e.read, e.write, e.timeout))
end
