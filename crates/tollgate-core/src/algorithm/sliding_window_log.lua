-- Sliding window log. Rust twin: sliding_window_log.rs (same phases, same arithmetic).
--
-- State: a sorted set with one member per distinct time, never one per unit, so a check of
-- any cost writes one member. An entry's member is its time ('<micros>') and its score the
-- running total: every unit admitted up to and including that entry. The member 'b' (base)
-- is scored by the running total just before the oldest entry, so it sorts first and the log
-- holds (newest score - base) units: no call sums or walks the whole log.
--   - expiry drops entries from the oldest until one is still in the window (work: the
--     entries dropped, fetched in batches), and moves the base up to the last one dropped;
--   - a denial's wait is the first entry whose score reaches base + excess (one
--     ZRANGEBYSCORE), because the oldest `excess` units have left once that entry has;
--   - a refund takes from the newest entry back (work: the entries it empties).
-- Times only grow along the log (an entry is made at max(now, newest time), as in the Rust
-- twin), so score order is time order. A log that empties is deleted, which also starts the
-- running totals from 0 again.
local sliding_window_log = {}

local BASE = 'b'
local EXPIRY_BATCH = 16 -- entries fetched at a time while dropping expired ones
-- Running totals above this are rebased to 0 (one rewrite of the log, at most MAX_LOG_LIMIT
-- entries): far below 2^53, so scores stay exact integers in Redis's doubles and Lua's. A key
-- admitting 10,000 units every millisecond without ever emptying takes over three years.
local REBASE_AT = 2 ^ 50

local function rebase(st)
  local all = redis.call('ZRANGE', st.key, 0, -1, 'WITHSCORES')
  local args = {}
  for i = 1, #all, 2 do
    args[#args + 1] = int(tonumber(all[i + 1]) - st.base)
    args[#args + 1] = all[i]
  end
  redis.call('ZADD', st.key, unpack(args))
  st.top = st.top - st.base
  st.base = 0
end

-- args: limit, period
function sliding_window_log.load(location, now, limit, period)
  local key = location.key -- a sorted set: always a key of its own
  local st = {key = key, limit = limit, period = period, base = 0, top = 0, newest = false, count = 0}
  local head = redis.call('ZRANGE', key, 0, EXPIRY_BATCH, 'WITHSCORES')
  if #head <= 2 then -- no key, or a base alone (never written so)
    return st
  end
  st.base = tonumber(head[2])
  -- the newest entry: in `head` when it holds the whole log
  if #head < 2 * (EXPIRY_BATCH + 1) then
    st.newest, st.top = tonumber(head[#head - 1]), tonumber(head[#head])
  else
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    st.newest, st.top = tonumber(last[1]), tonumber(last[2])
  end
  -- Entries at or before `now - period` have left the window.
  local cutoff = now - period
  if st.newest <= cutoff then
    redis.call('DEL', key)
    st.base, st.top, st.newest = 0, 0, false
    return st
  end
  local dropped, rank, batch = 0, 1, EXPIRY_BATCH
  while true do
    local live = false
    for i = 2 * rank + 1, #head, 2 do -- head[2r + 1] is the entry of rank r
      if tonumber(head[i]) > cutoff then
        live = true -- the first entry still in the window
        break
      end
      dropped = dropped + 1
      st.base = tonumber(head[i + 1])
    end
    if live then
      break
    end
    -- every entry fetched was expired (the newest is not): fetch the next ones
    rank = 1 + dropped
    batch = batch * 2
    head = redis.call('ZRANGE', key, rank, rank + batch - 1, 'WITHSCORES')
    rank = 0 -- ranks in `head` now start at the first unread entry
  end
  if dropped > 0 then
    redis.call('ZREMRANGEBYRANK', key, 1, dropped)
    redis.call('ZADD', key, int(st.base), BASE)
  end
  if st.base >= REBASE_AT then
    rebase(st)
  end
  st.count = st.top - st.base
  return st
end

function sliding_window_log.decide(st, now, probe)
  if st.count + probe <= st.limit then
    return true, 0
  end
  -- The cost fits once the oldest `excess` units have left the window.
  local excess = st.count + probe - st.limit
  local entry = redis.call('ZRANGEBYSCORE', st.key, int(st.base + excess), '+inf', 'LIMIT', 0, 1)
  return false, tonumber(entry[1]) + st.period - now
end

function sliding_window_log.consume(st, now, n)
  local at = now
  if st.newest and st.newest > now then
    at = st.newest
  end
  if not st.newest then
    redis.call('ZADD', st.key, 0, BASE)
    st.base, st.top = 0, 0
  end
  st.top = st.top + n
  -- an entry at `at` already there takes the new running total as its score
  redis.call('ZADD', st.key, int(st.top), int(at))
  st.newest = at
  st.count = st.count + n
  expire_at(st.key, at + st.period, now)
end

-- Gives back the newest `n` units.
function sliding_window_log.refund(st, now, n)
  local left = math.min(n, st.count)
  if left == 0 then
    return
  end
  st.count = st.count - left
  st.top = st.top - left
  if st.count == 0 then
    redis.call('DEL', st.key)
    st.base, st.top, st.newest = 0, 0, false
    return
  end
  while left > 0 do
    -- the entry before the newest (or the base) and the newest
    local pair = redis.call('ZRANGE', st.key, -2, -1, 'WITHSCORES')
    local held = tonumber(pair[4]) - tonumber(pair[2])
    if held > left then
      redis.call('ZADD', st.key, int(tonumber(pair[4]) - left), pair[3])
      left = 0
    else
      redis.call('ZREM', st.key, pair[3])
      left = left - held
    end
  end
  local last = redis.call('ZRANGE', st.key, -1, -1)
  st.newest = tonumber(last[1])
  expire_at(st.key, st.newest + st.period, now)
end

function sliding_window_log.report(st, now)
  local reset_after = 0
  if st.newest then
    reset_after = st.newest + st.period - now
  end
  return math.max(st.limit - st.count, 0), reset_after
end
