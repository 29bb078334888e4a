-- Shared by the wrk scripts of bench/run.sh (wrk 4, LuaJIT). Every Lua state of a wrk run (the
-- main one and one per thread) loads this file. It numbers the threads, counts the status codes
-- and the replayed answers of every response, and prints one line that run.sh parses:
--   @@BENCH {"rps":…, "p50_us":…, "p99_us":…, "codes":{"200":…}, …}
-- Settings come from the environment: BENCH_TOKEN (tenant bearer token), BENCH_NONCE (makes the
-- keys of this run unique), BENCH_PREFER (an optional Prefer header), BENCH_KEY (reuse.lua).

bench = {}
bench.token = os.getenv("BENCH_TOKEN") or "none"
bench.nonce = os.getenv("BENCH_NONCE") or tostring(os.time())
bench.prefer = os.getenv("BENCH_PREFER")
bench.body = os.getenv("BENCH_BODY") or
    '{"prompt":"a lighthouse at dawn, watercolour","n":1,"size":"1024x1024"}'

function bench.headers()
    local h = {
        ["Host"] = wrk.headers["Host"] or "127.0.0.1",
        ["Authorization"] = "Bearer " .. bench.token,
        ["Content-Type"] = "application/json",
    }
    if bench.prefer and bench.prefer ~= "" then
        h["Prefer"] = bench.prefer
    end
    return h
end

-- Main state: one table entry per thread, so that done() can gather their counters.
local threads = {}
local next_tid = 0

function setup(thread)
    thread:set("tid", next_tid)
    next_tid = next_tid + 1
    threads[#threads + 1] = thread
end

-- Thread states.
codes = {}
replayed = 0

function response(status, headers, body)
    codes[status] = (codes[status] or 0) + 1
    if headers["Idempotent-Replayed"] then
        replayed = replayed + 1
    end
end

function done(summary, latency, requests)
    local agg, rep = {}, 0
    for _, t in ipairs(threads) do
        for k, v in pairs(t:get("codes") or {}) do
            agg[k] = (agg[k] or 0) + v
        end
        rep = rep + (t:get("replayed") or 0)
    end
    local parts = {}
    for k, v in pairs(agg) do
        parts[#parts + 1] = string.format('"%d":%d', k, v)
    end
    local e = summary.errors
    local secs = summary.duration / 1e6
    io.write(string.format(
        '@@BENCH {"requests":%d,"seconds":%.3f,"rps":%.1f,"p50_us":%d,"p90_us":%d,' ..
        '"p99_us":%d,"p999_us":%d,"max_us":%d,"mean_us":%.1f,' ..
        '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
        '"codes":{%s},"replayed":%d}\n',
        summary.requests, secs, summary.requests / secs,
        latency:percentile(50), latency:percentile(90), latency:percentile(99),
        latency:percentile(99.9), latency.max, latency.mean,
        e.connect, e.read, e.write, e.status, e.timeout,
        table.concat(parts, ","), rep))
end
