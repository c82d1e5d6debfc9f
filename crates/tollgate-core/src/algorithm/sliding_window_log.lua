-- Sliding window log. Rust twin: sliding_window_log.rs (same phases, same arithmetic).
-- State: a sorted set with one member per admitted unit, scored by its time. Members are
-- '<time>:<ordinal>', the ordinal zero-padded to 5 digits (the limit is at most 10,000), so
-- units of the same microsecond sort oldest first and ZPOPMAX takes the newest.
local sliding_window_log = {}

local ZADD_CHUNK = 1000 -- members per ZADD, well inside Lua's stack for unpack()

-- args: limit, period
function sliding_window_log.load(slot, now, limit, period)
  local key = slot.key -- a sorted set: always a key of its own
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - period))
  return {key = key, limit = limit, period = period, count = redis.call('ZCARD', key)}
end

local function newest(st)
  if st.count == 0 then
    return nil
  end
  return tonumber(redis.call('ZRANGE', st.key, -1, -1, 'WITHSCORES')[2])
end

local function save_ttl(st, now)
  local t = newest(st)
  if t then
    expire_at(st.key, t + st.period, now)
  end
end

function sliding_window_log.decide(st, now, probe)
  if st.count + probe <= st.limit then
    return true, 0
  end
  -- The cost fits once the oldest `excess` units have left the window.
  local excess = st.count + probe - st.limit
  local oldest = redis.call('ZRANGE', st.key, excess - 1, excess - 1, 'WITHSCORES')
  return false, tonumber(oldest[2]) + st.period - now
end

function sliding_window_log.consume(st, now, n)
  local first = redis.call('ZCOUNT', st.key, int(now), int(now)) + 1
  local stamp = int(now)
  local args = {}
  for i = first, first + n - 1 do
    args[#args + 1] = stamp
    args[#args + 1] = string.format('%s:%05d', stamp, i)
    if #args >= 2 * ZADD_CHUNK then
      redis.call('ZADD', st.key, unpack(args))
      args = {}
    end
  end
  if #args > 0 then
    redis.call('ZADD', st.key, unpack(args))
  end
  st.count = st.count + n
  save_ttl(st, now)
end

function sliding_window_log.refund(st, now, n)
  local taken = math.min(n, st.count)
  if taken > 0 then
    redis.call('ZPOPMAX', st.key, taken)
    st.count = st.count - taken
    save_ttl(st, now)
  end
end

function sliding_window_log.report(st, now)
  local t = newest(st)
  local reset_after = 0
  if t then
    reset_after = t + st.period - now
  end
  return math.max(st.limit - st.count, 0), reset_after
end
