-- Tollgate's Lua twins of the algorithms in crates/tollgate-core/src/algorithm/*.rs, run by
-- tollgate-redis. A script is a comment giving the argument layout, this prelude, the
-- algorithms a rule set uses (script.rs registers each in ALGORITHMS under its number), and
-- engine.lua, which runs the parts of a call.
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

-- The last timestamp-sized number (at least 10^12) written as text, and read from text: in a
-- library, which keeps them between calls, the next call often writes or reads the same one
-- (a fixed window's start, the same for every key in the window), and string.format and
-- tonumber cost about 2,000 and 1,500 instructions where a comparison costs next to nothing.
local written, written_text, read_text, read = false, false, false, 0

local function int(x)
  if x == written then
    return written_text
  end
  local text = string.format('%d', x)
  if x >= 1e12 then
    written, written_text = x, text
  end
  return text
end

-- A stored field's value as a number, 0 when absent (`false`, as Redis gives a missing field).
local function num(text)
  if text == read_text then
    return read
  end
  local n = tonumber(text) or 0
  if n >= 1e12 then
    read_text, read = text, n
  end
  return n
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

-- Whether `now` is Redis's own clock (set by the engine): see hstore.
local CLOCK_IS_REDIS = false

-- A rule's state location: {key = KEYS[i], prefix = field prefix}. Hash-stored states share
-- one hash per key, each rule's fields prefixed by its id (prefix = '<id>.'); with prefix = ''
-- the key is the rule's own. After hload, `had` is the expiry the stored state was written with
-- (0 when none; each algorithm's load sets it), so that hstore can skip a PEXPIRE that would not
-- lengthen the key's life.
--
-- These helpers take two or three fields rather than a list: a script pays for every table it
-- makes (allocation and garbage collection cost more than the Redis calls; see "Leaner
-- scripts" in docs/benchmarks.md), so the hot path makes as few as it can.

-- Returns the location's fields f1, f2 (and f3) as numbers, 0 when absent.
local function hload(location, f1, f2, f3)
  local prefix = location.prefix
  location.had = 0
  if f3 then
    local v = redis.call('HMGET', location.key, prefix .. f1, prefix .. f2, prefix .. f3)
    return num(v[1]), num(v[2]), num(v[3])
  end
  local v = redis.call('HMGET', location.key, prefix .. f1, prefix .. f2)
  return num(v[1]), num(v[2])
end

-- The latest expiry (microseconds) each key's TTL was set to cover during this call (set by
-- the engine at the start of each call); `false` when the call decides one rule alone, whose
-- key no later rule of the call can meet: then nothing is recorded (a table less per call).
local TTL_COVERS = false

-- Writes fields f1, f2 (and f3) with values v1, v2 (and v3) and makes the key live at least
-- until `expires_at`. A shared hash lives as long as its longest-lived state: its TTL only ever
-- grows (GT), and a key without one gets one (NX). Every key Tollgate writes has a TTL, so when
-- the state was stored before (`had`) the key has one, and when that was with an expiry at least
-- as late, it already covers this one and is left alone; only when `now` is Redis's clock,
-- which TTLs count on (an explicit `now` in tests may run slower than Redis's, see
-- TTL_MARGIN_MS). The same holds for a TTL written earlier in this call, by another rule of the
-- key.
local function hstore(location, expires_at, now, f1, v1, f2, v2, f3, v3)
  local key, prefix = location.key, location.prefix
  if f3 then
    redis.call('HSET', key, prefix .. f1, v1, prefix .. f2, v2, prefix .. f3, v3)
  else
    redis.call('HSET', key, prefix .. f1, v1, prefix .. f2, v2)
  end
  if prefix == '' then
    expire_at(key, expires_at, now)
    return
  end
  local covered = TTL_COVERS and TTL_COVERS[key]
  if (covered and covered >= expires_at) or (CLOCK_IS_REDIS and location.had >= expires_at) then
    return
  end
  local ms = floor_div(expires_at - now + 999, 1000)
  if ms < 1 then
    ms = 1
  end
  ms = int(ms + TTL_MARGIN_MS)
  if covered or location.had > 0 or redis.call('PEXPIRE', key, ms, 'NX') == 0 then
    redis.call('PEXPIRE', key, ms, 'GT')
  end
  if TTL_COVERS then
    TTL_COVERS[key] = math.max(covered or 0, expires_at)
  end
end

-- Forgets the location's state: its key, or its fields f1, f2 (and f3) of the shared hash.
local function hclear(location, f1, f2, f3)
  local prefix = location.prefix
  -- the key may be gone now, and recreated without a TTL by the next store
  location.had = 0
  if TTL_COVERS then
    TTL_COVERS[location.key] = nil
  end
  if prefix == '' then
    redis.call('DEL', location.key)
  elseif f3 then
    redis.call('HDEL', location.key, prefix .. f1, prefix .. f2, prefix .. f3)
  else
    redis.call('HDEL', location.key, prefix .. f1, prefix .. f2)
  end
end
