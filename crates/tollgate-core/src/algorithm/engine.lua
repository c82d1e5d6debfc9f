-- Runs one operation on a rule set, in the phases of crates/tollgate-core/src/algorithm/mod.rs.
--
-- KEYS[i]: the state of rule i (all keys share one hash tag, so this runs on Redis Cluster).
-- ARGV: operation ('check', 'acquire', 'refund' or 'release'); now in microseconds ('' to use
--   Redis's own clock); amount (the cost, or the refund); lease id; lease units; then six
--   values per rule: its algorithm (its number in ALGORITHMS), four parameters, and the prefix
--   of its fields in the key's shared hash ('' when the key is its own; see hload in
--   prelude.lua).
-- Reply: {now, then per rule: admitted (1 or 0), remaining, reset_after, retry_after}, times in
--   microseconds.

local HEADER = 5
local PER_RULE = 6

local op = ARGV[1]
local now = tonumber(ARGV[2])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end
local amount = tonumber(ARGV[3])
local lease_id = ARGV[4]
local lease_units = tonumber(ARGV[5])

-- 1. Load and refresh every rule's state.
local rules = {}
for i = 1, #KEYS do
  local at = HEADER + (i - 1) * PER_RULE
  local algorithm = ALGORITHMS[tonumber(ARGV[at + 1])]
  local slot = {key = KEYS[i], p = ARGV[at + 6]}
  local state = algorithm.load(slot, now, tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]),
                               tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5]))
  rules[i] = {algorithm = algorithm, state = state}
end

-- 2. Refunds and releases.
if op == 'refund' then
  for _, rule in ipairs(rules) do
    if rule.algorithm.refund then -- leases are given back by release, not refund
      rule.algorithm.refund(rule.state, now, amount)
    end
  end
elseif op == 'release' then
  for _, rule in ipairs(rules) do
    if rule.algorithm.release then
      rule.algorithm.release(rule.state, now, lease_id, lease_units)
    end
  end
end

-- 3. Decide every rule for the probe cost (a peek asks about one unit).
local cost = 0
if op == 'check' or op == 'acquire' then
  cost = amount
end
local probe = math.max(cost, 1)
local admitted = true
for _, rule in ipairs(rules) do
  rule.admits, rule.wait = rule.algorithm.decide(rule.state, now, probe)
  admitted = admitted and rule.admits
end

-- 4. All or nothing: consume only if every rule admits.
if admitted and cost > 0 then
  for _, rule in ipairs(rules) do
    if rule.algorithm.acquire then
      if op == 'acquire' then
        rule.algorithm.acquire(rule.state, now, cost, lease_id)
      end
    else
      rule.algorithm.consume(rule.state, now, cost)
    end
  end
end

-- 5. Report.
local reply = {now}
for _, rule in ipairs(rules) do
  local remaining, reset_after = rule.algorithm.report(rule.state, now)
  local admits, retry_after = 0, 0
  if rule.admits then
    admits = 1
  else
    retry_after = rule.wait
  end
  reply[#reply + 1] = admits
  reply[#reply + 1] = remaining
  reply[#reply + 1] = reset_after
  reply[#reply + 1] = retry_after
end
return reply
