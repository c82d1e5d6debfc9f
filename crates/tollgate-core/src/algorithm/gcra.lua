-- GCRA with exact rational time; also the token bucket's engine. Rust twin: gcra.rs (same
-- phases, same arithmetic).
-- Times are pairs (whole microseconds, fraction / den), 0 <= fraction < den.
-- State: hash fields {t = tat's whole microseconds, f = its fraction} (see hload in
-- prelude.lua); none is a full bucket.
local gcra = {}

local function less(aw, af, bw, bf)
  return aw < bw or (aw == bw and af < bf)
end

-- k * T
local function times(st, k)
  local q, r = divmod(k * st.remainder, st.den)
  return k * st.quotient + q, r
end

local function add(st, aw, af, bw, bf)
  local f = af + bf
  if f >= st.den then
    return aw + bw + 1, f - st.den
  end
  return aw + bw, f
end

-- a - b, for a >= b
local function sub(st, aw, af, bw, bf)
  local f = af - bf
  if f < 0 then
    return aw - bw - 1, f + st.den
  end
  return aw - bw, f
end

local function ceil_micros(w, f)
  if f > 0 then
    return w + 1
  end
  return w
end

-- Time until the bucket is full: max(tat - now, 0).
local function debt(st, now)
  if less(now, 0, st.tw, st.tf) then
    return sub(st, st.tw, st.tf, now, 0)
  end
  return 0, 0
end

local function save(st, now)
  if st.tw > 0 or st.tf > 0 then
    hstore(st.location, ceil_micros(st.tw, st.tf), now, 't', int(st.tw), 'f', int(st.tf))
  else
    hclear(st.location, 't', 'f')
  end
end

-- args: capacity, quotient, remainder, den, where T = quotient + remainder / den microseconds;
-- `into`, a state table to fill rather than make a new one (see check in engine.lua)
function gcra.load(location, now, capacity, quotient, remainder, den, into)
  local tw, tf = hload(location, 't', 'f')
  if tw > 0 or tf > 0 then
    location.had = ceil_micros(tw, tf) -- as `save` stored it
  end
  local st = into or {location = false, capacity = 0, quotient = 0, remainder = 0, den = 1, num = 0,
                      tw = 0, tf = 0}
  st.location, st.capacity, st.quotient, st.remainder, st.den = location, capacity, quotient, remainder, den
  st.num, st.tw, st.tf = quotient * den + remainder, tw, tf
  if not less(now, 0, st.tw, st.tf) then
    st.tw = 0
    st.tf = 0
  end
  return st
end

function gcra.decide(st, now, probe)
  local dw, df = debt(st, now)
  local pw, pf = times(st, probe)
  local nw, nf = add(st, dw, df, pw, pf)
  local rw, rf = times(st, st.capacity)
  if not less(rw, rf, nw, nf) then
    return true, 0
  end
  return false, ceil_micros(sub(st, nw, nf, rw, rf))
end

function gcra.consume(st, now, n)
  local dw, df = debt(st, now)
  local cw, cf = times(st, n)
  dw, df = add(st, dw, df, cw, cf)
  st.tw, st.tf = add(st, dw, df, now, 0)
  save(st, now)
end

function gcra.refund(st, now, n)
  local dw, df = debt(st, now)
  local bw, bf = times(st, n)
  if less(bw, bf, dw, df) then
    dw, df = sub(st, dw, df, bw, bf)
    st.tw, st.tf = add(st, dw, df, now, 0)
  else
    st.tw, st.tf = 0, 0
  end
  save(st, now)
end

-- k * T < (w, f)
local function times_less(st, k, w, f)
  local kw, kf = times(st, k)
  return less(kw, kf, w, f)
end

-- Units short of full: the smallest k with k * T >= debt, at most the capacity. Estimated in
-- floating point, then settled exactly (the estimate is off by at most one).
local function units_owed(st, dw, df)
  if times_less(st, st.capacity, dw, df) then
    return st.capacity
  end
  local k = math.min(math.max(math.floor((dw * st.den + df) / st.num), 0), st.capacity)
  while k < st.capacity and times_less(st, k, dw, df) do
    k = k + 1
  end
  while k > 0 and not times_less(st, k - 1, dw, df) do
    k = k - 1
  end
  return k
end

function gcra.report(st, now)
  local dw, df = debt(st, now)
  return st.capacity - units_owed(st, dw, df), ceil_micros(dw, df)
end
