-- Runs a batch of operations, in the phases of crates/tollgate-core/src/algorithm/mod.rs
-- (run_group): parts of one group are all or nothing; groups run one after another.
--
-- KEYS: the state of each part's rules, part after part (all keys share one hash tag on Redis
--   Cluster, so this runs there unchanged).
-- ARGV: now in microseconds ('' to use Redis's own clock); then per part: operation ('check',
--   'acquire', 'refund' or 'release'), amount (the cost, or the refund), lease id, lease units,
--   joins (1 when the part is in the previous part's group), its number of rules; then six
--   values per rule: its algorithm (its number in ALGORITHMS), four parameters, and the prefix
--   of its fields in the key's shared hash ('' when the key is its own; see hload in
--   prelude.lua).
-- Reply: {now, then per part and rule: admitted (1 or 0), remaining, reset_after,
--   retry_after}, times in microseconds.

local PART_HEADER = 6
local PER_RULE = 6

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end

-- The parts; each rule is {key, p (field prefix), at (its first argument)}, also its slot.
local parts = {}
local at, k = 2, 0
while at <= #ARGV do
  local part = {op = ARGV[at], amount = tonumber(ARGV[at + 1]), lease_id = ARGV[at + 2],
                lease_units = tonumber(ARGV[at + 3]), joins = ARGV[at + 4] == '1', rules = {}}
  local n = tonumber(ARGV[at + 5])
  at = at + PART_HEADER
  for j = 1, n do
    k = k + 1
    part.rules[j] = {key = KEYS[k], p = ARGV[at + 5], at = at}
    at = at + PER_RULE
  end
  parts[#parts + 1] = part
end

local function load(rule)
  local at = rule.at
  rule.algorithm = ALGORITHMS[tonumber(ARGV[at])]
  rule.state = rule.algorithm.load(rule, now, tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]),
                                   tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4]))
  rule.demand = 0
end

local reply = {now}

-- Runs parts[first..last], one group.
local function run(first, last)
  -- 1. Load and refresh each state once: parts of a group naming the same state share it.
  local states, seen = {}, {}
  for i = first, last do
    local part = parts[i]
    part.states = {}
    for j, rule in ipairs(part.rules) do
      local state = rule
      if first == last then
        load(rule)
        states[#states + 1] = rule
      else
        local id = rule.key .. '\0' .. rule.p
        state = seen[id]
        if not state then
          state = rule
          seen[id] = rule
          load(rule)
          states[#states + 1] = rule
        end
      end
      part.states[j] = state
      if part.op == 'check' or part.op == 'acquire' then
        state.demand = state.demand + part.amount
      end
      if part.op == 'acquire' then
        state.lease_id = part.lease_id
      end
    end
  end

  -- 2. Refunds and releases.
  for i = first, last do
    local part = parts[i]
    for _, state in ipairs(part.states) do
      if part.op == 'refund' and state.algorithm.refund then -- leases go back by release
        state.algorithm.refund(state.state, now, part.amount)
      elseif part.op == 'release' and state.algorithm.release then
        state.algorithm.release(state.state, now, part.lease_id, part.lease_units)
      end
    end
  end

  -- 3. Decide each state for its demand (a peek asks about one unit).
  local admitted = true
  for _, state in ipairs(states) do
    state.admits, state.wait = state.algorithm.decide(state.state, now, math.max(state.demand, 1))
    admitted = admitted and state.admits
  end

  -- 4. All or nothing: consume only if every state admits.
  if admitted then
    for _, state in ipairs(states) do
      if state.demand > 0 then
        if state.algorithm.acquire then
          if state.lease_id then
            state.algorithm.acquire(state.state, now, state.demand, state.lease_id)
          end
        else
          state.algorithm.consume(state.state, now, state.demand)
        end
      end
    end
  end

  -- 5. Report.
  for i = first, last do
    for _, state in ipairs(parts[i].states) do
      local remaining, reset_after = state.algorithm.report(state.state, now)
      local admits, retry_after = 0, 0
      if state.admits then
        admits = 1
      else
        retry_after = state.wait
      end
      reply[#reply + 1] = admits
      reply[#reply + 1] = remaining
      reply[#reply + 1] = reset_after
      reply[#reply + 1] = retry_after
    end
  end
end

local first = 1
while first <= #parts do
  local last = first
  while parts[last + 1] and parts[last + 1].joins do
    last = last + 1
  end
  run(first, last)
  first = last + 1
end
return reply
