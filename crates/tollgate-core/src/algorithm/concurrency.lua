-- Concurrency leases. Rust twin: concurrency.rs (same phases, same arithmetic).
-- State: a sorted set with one member per held unit, '<lease id>:<n>', scored by the lease's
-- expiry.
local concurrency = {}

local CHUNK = 1000 -- members per ZADD or ZREM, well inside Lua's stack for unpack()

-- args: limit, lease duration
function concurrency.load(slot, now, limit, lease)
  local key = slot.key -- a sorted set: always a key of its own
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
  return {key = key, limit = limit, lease = lease, count = redis.call('ZCARD', key)}
end

local function last_expiry(st)
  if st.count == 0 then
    return nil
  end
  return tonumber(redis.call('ZRANGE', st.key, -1, -1, 'WITHSCORES')[2])
end

function concurrency.decide(st, now, probe)
  if st.count + probe <= st.limit then
    return true, 0
  end
  -- Without releases, the cost fits once the `excess` soonest-expiring units have expired.
  local excess = st.count + probe - st.limit
  local soonest = redis.call('ZRANGE', st.key, excess - 1, excess - 1, 'WITHSCORES')
  return false, tonumber(soonest[2]) - now
end

function concurrency.acquire(st, now, n, id)
  local expires = int(now + st.lease)
  local args = {}
  for i = 1, n do
    args[#args + 1] = expires
    args[#args + 1] = string.format('%s:%d', id, i)
    if #args >= 2 * CHUNK then
      redis.call('ZADD', st.key, unpack(args))
      args = {}
    end
  end
  if #args > 0 then
    redis.call('ZADD', st.key, unpack(args))
  end
  st.count = st.count + n
  expire_at(st.key, last_expiry(st), now)
end

function concurrency.release(st, now, id, units)
  local members = {}
  for i = 1, units do
    members[#members + 1] = string.format('%s:%d', id, i)
    if #members >= CHUNK or i == units then
      redis.call('ZREM', st.key, unpack(members))
      members = {}
    end
  end
  st.count = redis.call('ZCARD', st.key)
end

function concurrency.report(st, now)
  local t = last_expiry(st)
  local reset_after = 0
  if t then
    reset_after = t - now
  end
  return math.max(st.limit - st.count, 0), reset_after
end
