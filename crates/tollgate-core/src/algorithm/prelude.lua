-- Tollgate's Lua twins of the algorithms in crates/tollgate-core/src/algorithm/*.rs, run by
-- tollgate-redis. A script is this prelude, the algorithms a rule set uses (lua.rs registers
-- each in ALGORITHMS under its number), and engine.lua, which runs one operation over the rule
-- set.
--
-- Numbers are doubles. Every value computed stays below 2^53, where doubles are exact
-- integers, so these twins compute bit for bit what the Rust ones do. Numbers are turned into
-- text with string.format('%d') only: Lua's tostring() and '..' keep 14 digits, and a
-- microsecond timestamp has 16.

-- A key outlives its state by this much: a state's content always says when it is stale, so a
-- late expiry changes nothing, while an early one would lose state whenever Redis's clock runs
-- ahead of the `now` the script was given (an explicit `now` in tests).
local TTL_MARGIN_MS = 1000

-- The algorithms in this script, by number.
local ALGORITHMS = {}

local function int(x)
  return string.format('%d', x)
end

-- floor(a / b) and the remainder, exact for integers below 2^53 and b > 0: the quotient is
-- corrected in case the division rounded across an integer.
local function divmod(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
    r = r + b
  elseif r >= b then
    q = q + 1
    r = r - b
  end
  return q, r
end

local function floor_div(a, b)
  local q = divmod(a, b)
  return q
end

-- Gives `key` a TTL covering its state, which expires at `expires_at` (microseconds).
local function expire_at(key, expires_at, now)
  local ms = floor_div(expires_at - now + 999, 1000)
  if ms < 1 then
    ms = 1
  end
  redis.call('PEXPIRE', key, int(ms + TTL_MARGIN_MS))
end

-- Reads hash fields as numbers, 0 when absent.
local function hnumbers(key, ...)
  local values = redis.call('HMGET', key, ...)
  for i = 1, #values do
    values[i] = tonumber(values[i]) or 0
  end
  return values
end
