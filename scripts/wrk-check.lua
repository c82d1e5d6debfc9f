-- wrk script for scripts/bench-http: POST /v1/check for a random key of 10,000 under one policy.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local policy = os.getenv("POLICY") or "bench"
request = function()
  local body = string.format('{"key":"user-%d","policy":"%s"}', math.random(10000), policy)
  return wrk.format(nil, nil, nil, body)
end
