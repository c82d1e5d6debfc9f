-- Concurrency leases. Rust twin: concurrency.rs (same phases, same arithmetic).
--
-- State: a sorted set holding, per lease, never per unit, two members scored by the lease's
-- expiry: '<id>' (so that a release finds the expiry by ZSCORE) and '<id>=<units>' (the units
-- it holds; lease ids are letters, digits, '-' and '_', so '=' and '#' never occur in one);
-- and '#<total>' scored +inf, the units of all leases, so that no call sums them.
--   - expiry drops the leases that have expired (work: those leases);
--   - a release finds its lease by ZSCORE and ZRANGEBYSCORE at that expiry (work: the leases
--     of that same microsecond);
--   - a denial's wait walks leases from the soonest expiring until the excess is covered.
-- A set whose leases are all gone is deleted.
local concurrency = {}

local WALK_BATCH = 32 -- members fetched at a time by a denial's walk

-- Sets the total to `n`, or deletes the key when no unit is held.
local function set_total(st, n)
  if n == 0 then
    redis.call('DEL', st.key)
  else
    if st.count > 0 then
      redis.call('ZREM', st.key, '#' .. int(st.count))
    end
    redis.call('ZADD', st.key, '+inf', '#' .. int(n))
  end
  st.count = n
end

-- The units of a '<id>=<units>' member; nil for an '<id>' member.
local function units_of(member)
  local eq = string.find(member, '=', 1, true)
  if eq then
    return tonumber(string.sub(member, eq + 1))
  end
  return nil
end

-- args: limit, lease duration
function concurrency.load(location, now, limit, lease)
  local key = location.key -- a sorted set: always a key of its own
  local st = {key = key, limit = limit, lease = lease, count = 0}
  local top = redis.call('ZRANGE', key, -1, -1)
  if #top == 0 then
    return st
  end
  st.count = tonumber(string.sub(top[1], 2))
  local expired = redis.call('ZRANGEBYSCORE', key, '-inf', int(now))
  if #expired > 0 then
    local freed = 0
    for _, member in ipairs(expired) do
      freed = freed + (units_of(member) or 0)
    end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
    set_total(st, st.count - freed)
  end
  return st
end

local function last_expiry(st)
  if st.count == 0 then
    return nil
  end
  -- the latest lease sorts just below the total
  return tonumber(redis.call('ZRANGE', st.key, -2, -2, 'WITHSCORES')[2])
end

function concurrency.decide(st, now, probe)
  if st.count + probe <= st.limit then
    return true, 0
  end
  -- Without releases, the cost fits once the `excess` soonest-expiring units have expired.
  local excess = st.count + probe - st.limit
  local seen, from = 0, 0
  while true do
    local batch = redis.call('ZRANGE', st.key, from, from + WALK_BATCH - 1, 'WITHSCORES')
    if #batch == 0 then
      return false, st.lease -- unreachable: probe <= limit, so excess <= total
    end
    for i = 1, #batch, 2 do
      local units = units_of(batch[i]) -- nil for ids and the total
      if units then
        seen = seen + units
        if seen >= excess then
          return false, tonumber(batch[i + 1]) - now
        end
      end
    end
    from = from + WALK_BATCH
  end
end

-- Takes the units under lease `id`; without one (a check), nothing (see concurrency.rs).
function concurrency.consume(st, now, n, id)
  if not id then
    return
  end
  local expires = int(now + st.lease)
  redis.call('ZADD', st.key, expires, id, expires, id .. '=' .. int(n))
  set_total(st, st.count + n)
  expire_at(st.key, last_expiry(st), now)
end

function concurrency.release(st, now, id, units)
  local expires = redis.call('ZSCORE', st.key, id)
  if not expires then
    return
  end
  local prefix = id .. '='
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', st.key, expires, expires)) do
    if string.sub(member, 1, #prefix) == prefix then
      local held = tonumber(string.sub(member, #prefix + 1))
      local freed = math.min(units, held)
      redis.call('ZREM', st.key, member)
      if held > freed then
        redis.call('ZADD', st.key, expires, prefix .. int(held - freed))
      else
        redis.call('ZREM', st.key, id)
      end
      set_total(st, st.count - freed)
      return
    end
  end
end

function concurrency.report(st, now)
  local t = last_expiry(st)
  local reset_after = 0
  if t then
    reset_after = t - now
  end
  return math.max(st.limit - st.count, 0), reset_after
end
