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

-- A rule's state place: {key = KEYS[i], p = field prefix}. Hash-stored states share one hash
-- per key, each rule's fields prefixed by its id (p = '<id>.'); with p = '' the key is the
-- rule's own.
local function prefixed(slot, fields)
  if slot.p == '' then
    return fields
  end
  local out = {}
  for i = 1, #fields do
    out[i] = slot.p .. fields[i]
  end
  return out
end

-- Reads the slot's fields as numbers, 0 when absent.
local function hload(slot, ...)
  return hnumbers(slot.key, unpack(prefixed(slot, {...})))
end

-- Writes field/value pairs and makes the key live at least until `expires_at`. A shared hash
-- lives as long as its longest-lived state: PEXPIRE NX gives a new key its TTL, GT only ever
-- lengthens it (a late expiry is harmless, see TTL_MARGIN_MS).
local function hstore(slot, expires_at, now, ...)
  local pairs_ = {...}
  for i = 1, #pairs_, 2 do
    pairs_[i] = slot.p .. pairs_[i]
  end
  redis.call('HSET', slot.key, unpack(pairs_))
  if slot.p == '' then
    expire_at(slot.key, expires_at, now)
  else
    local ms = floor_div(expires_at - now + 999, 1000)
    if ms < 1 then
      ms = 1
    end
    ms = int(ms + TTL_MARGIN_MS)
    redis.call('PEXPIRE', slot.key, ms, 'NX')
    redis.call('PEXPIRE', slot.key, ms, 'GT')
  end
end

-- Forgets the slot's state: its key, or its fields of the shared hash.
local function hclear(slot, ...)
  if slot.p == '' then
    redis.call('DEL', slot.key)
  else
    redis.call('HDEL', slot.key, unpack(prefixed(slot, {...})))
  end
end
