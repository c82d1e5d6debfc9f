-- Sliding window counter. Rust twin: sliding_window_counter.rs (same phases, same arithmetic,
-- including the order of every floating-point operation).
-- State: hash fields {s = window start, p = previous window's count, c = current window's
-- count} (see hload in prelude.lua).
local sliding_window_counter = {}

-- Rolls counts stored for window `start` over to the window holding `at`.
local function roll(period, start, previous, current, at)
  local ws = floor_div(at, period) * period
  if start == ws then
    return ws, previous, current
  elseif start == ws - period then
    return ws, current, 0
  end
  return ws, 0, 0
end

local function estimate(period, start, previous, current, at)
  local weight = (period - (at - start)) / period
  return previous * weight + current
end

local function admits_at(st, at, probe)
  local start, previous, current = roll(st.period, st.start, st.previous, st.current, at)
  return estimate(st.period, start, previous, current, at) + probe <= st.limit
end

local function expires_at(st)
  if st.current > 0 then
    return st.start + 2 * st.period
  elseif st.previous > 0 then
    return st.start + st.period
  end
  return nil
end

local function save(st, now)
  local t = expires_at(st)
  if t then
    hstore(st.location, t, now, 's', int(st.start), 'p', int(st.previous), 'c', int(st.current))
  else
    hclear(st.location, 's', 'p', 'c')
  end
end

-- args: limit, period; `into`, a state table to fill rather than make a new one (see check in
-- engine.lua)
function sliding_window_counter.load(location, now, limit, period, _, _, into)
  local start, previous, current = hload(location, 's', 'p', 'c')
  if current > 0 then -- as `save` stored it (see expires_at)
    location.had = start + 2 * period
  elseif previous > 0 then
    location.had = start + period
  end
  local st = into or {location = false, limit = 0, period = 0, start = 0, previous = 0, current = 0}
  st.location, st.limit, st.period = location, limit, period
  st.start, st.previous, st.current = roll(period, start, previous, current, now)
  return st
end

function sliding_window_counter.decide(st, now, probe)
  if admits_at(st, now, probe) then
    return true, 0
  end
  local budget = st.limit - probe
  local at
  if st.current <= budget then
    at = (st.start + st.period) - (budget - st.current) * st.period / st.previous
  else
    at = (st.start + 2 * st.period) - budget * st.period / st.current
  end
  at = math.max(math.ceil(at), now)
  for _ = 1, 8 do
    if admits_at(st, at, probe) then
      break
    end
    at = at + 1
  end
  return false, at - now
end

function sliding_window_counter.consume(st, now, n)
  st.current = st.current + n
  save(st, now)
end

function sliding_window_counter.refund(st, now, n)
  local from_current = math.min(n, st.current)
  st.current = st.current - from_current
  st.previous = math.max(st.previous - (n - from_current), 0)
  save(st, now)
end

function sliding_window_counter.report(st, now)
  local left = math.max(math.floor(st.limit - estimate(st.period, st.start, st.previous, st.current, now)), 0)
  local reset_after = 0
  local t = expires_at(st)
  if t then
    reset_after = t - now
  end
  return left, reset_after
end
