-- Fixed window. Rust twin: fixed_window.rs (same phases, same arithmetic).
-- State: hash fields {s = window start, c = count} (see hload in prelude.lua); none is a count
-- of zero.
local fixed_window = {}

local ALIGN_CLOCK = 0

-- args: limit, period, align (0 clock, 1 first hit); `into`, a state table to fill rather than
-- make a new one (see check in engine.lua)
function fixed_window.load(location, now, limit, period, align, _, into)
  local start, count = hload(location, 's', 'c')
  if count > 0 then
    location.had = start + period -- as `save` stored it
  end
  local st = into or {location = false, limit = 0, period = 0, clock = false, start = 0, count = 0}
  st.location, st.limit, st.period, st.clock = location, limit, period, align == ALIGN_CLOCK
  st.start, st.count = start, count
  if st.clock then
    local start = floor_div(now, period) * period
    if st.start ~= start then
      st.start = start
      st.count = 0
    end
  elseif st.count > 0 and now >= st.start + period then
    st.start = 0
    st.count = 0
  end
  return st
end

local function window_end(st, now)
  if not st.clock and st.count == 0 then
    return now + st.period
  end
  return st.start + st.period
end

local function save(st, now)
  if st.count > 0 then
    hstore(st.location, st.start + st.period, now, 's', int(st.start), 'c', int(st.count))
  else
    hclear(st.location, 's', 'c')
  end
end

function fixed_window.decide(st, now, probe)
  if st.count + probe <= st.limit then
    return true, 0
  end
  return false, window_end(st, now) - now
end

function fixed_window.consume(st, now, n)
  if not st.clock and st.count == 0 then
    st.start = now
  end
  st.count = st.count + n
  save(st, now)
end

function fixed_window.refund(st, now, n)
  st.count = math.max(st.count - n, 0)
  save(st, now)
end

function fixed_window.report(st, now)
  local reset_after = 0
  if st.count > 0 then
    reset_after = window_end(st, now) - now
  end
  return math.max(st.limit - st.count, 0), reset_after
end
