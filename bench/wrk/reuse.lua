-- POST with one Idempotency-Key (BENCH_KEY) on every request: the replay of one completed job.
dofile((os.getenv("BENCH_WRK_DIR") or "bench/wrk") .. "/lib.lua")

local req

function init(args)
    local h = bench.headers()
    h["Idempotency-Key"] = os.getenv("BENCH_KEY") or "bench-replay"
    req = wrk.format("POST", nil, h, bench.body)
end

function request()
    return req
end
