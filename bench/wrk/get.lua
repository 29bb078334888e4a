-- GET of the URL's path (a job) with the tenant's token.
dofile((os.getenv("BENCH_WRK_DIR") or "bench/wrk") .. "/lib.lua")

local req

function init(args)
    local h = bench.headers()
    h["Content-Type"] = nil
    req = wrk.format("GET", nil, h, nil)
end

function request()
    return req
end
