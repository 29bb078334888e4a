-- POST with a new Idempotency-Key on every request: bench-NONCE-THREAD-COUNTER.
dofile((os.getenv("BENCH_WRK_DIR") or "bench/wrk") .. "/lib.lua")

local counter = 0
local headers

function init(args)
    headers = bench.headers()
end

function request()
    counter = counter + 1
    headers["Idempotency-Key"] = string.format("bench-%s-%d-%d", bench.nonce, tid, counter)
    return wrk.format("POST", nil, headers, bench.body)
end
