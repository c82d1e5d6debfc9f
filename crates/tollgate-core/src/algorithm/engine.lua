-- Runs a batch of operations, in the phases of crates/tollgate-core/src/algorithm/mod.rs
-- (run_group): parts of one group are all or nothing; groups run one after another.
--
-- KEYS: the state of each part's rules, part after part (all keys share one hash tag on Redis
--   Cluster, so this runs there unchanged).
-- ARGV: now in microseconds ('' to use Redis's own clock); the number of distinct rules, then
--   six values per rule: its algorithm (its number in ALGORITHMS), four parameters, and the
--   prefix of its fields in the key's shared hash ('' when the key is its own; see hload in
--   prelude.lua). Then the parts, each in one of two forms:
--   - 'r' (a run of lone checks: single-rule parts, each its own group, of one rule), the
--     rule's number, how many checks, then each check's cost;
--   - any other part: operation ('check', 'acquire', 'refund' or 'release'), amount (the cost,
--     or the refund), lease id, lease units, joins (1 when the part is in the previous part's
--     group), its number of rules, then each rule's number.
--   Rules are listed once however many parts name them, because Redis pays for every argument
--   (a coalesced batch is usually many keys under one rule set).
-- Reply: {now, then per part and rule: admitted (1 or 0), remaining, reset_after,
--   retry_after}, times in microseconds.

local PART_HEADER = 6
local PER_RULE = 6

local now = tonumber(ARGV[1])
CLOCK_IS_REDIS = not now
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end

-- The rules, parsed once: {algorithm, its four parameters a..d, field prefix p, and the slot and
-- state tables that lone checks of the rule reuse (see check)}.
local RULES = {}
local at = 3
for i = 1, tonumber(ARGV[2]) do
  RULES[i] = {algorithm = ALGORITHMS[tonumber(ARGV[at])], a = tonumber(ARGV[at + 1]),
              b = tonumber(ARGV[at + 2]), c = tonumber(ARGV[at + 3]), d = tonumber(ARGV[at + 4]),
              p = ARGV[at + 5], slot = false, state = false}
  at = at + PER_RULE
end

local reply = {now}
-- Every part's rules, in order: {key, p (field prefix), its rule, and its part's op, cost,
-- amount and lease}. Each is also the rule's slot (see hload) and holds its state; in a group where several parts name one state, the later ones point at the first
-- (`same`).
local R = {}

-- Runs the rules R[lo..hi], one group's; `joint` when the group has several parts.
local function run(lo, hi, joint)
  -- 1. Load and refresh each state once, and add up what the group asks of it.
  local seen = joint and {}
  for i = lo, hi do
    local r = R[i]
    local s = r
    if joint then
      local id = r.key .. '\0' .. r.p
      s = seen[id]
      if s then
        r.same = s
      else
        s = r
        seen[id] = r
      end
    end
    if s == r then
      local rule = r.rule
      r.algorithm = rule.algorithm
      r.state = r.algorithm.load(r, now, rule.a, rule.b, rule.c, rule.d)
      r.demand = 0
    end
    s.demand = s.demand + r.cost
    if r.op == 'acquire' then
      s.lease_id = r.lease_id
    end
  end

  -- 2. Refunds and releases.
  for i = lo, hi do
    local r = R[i]
    local s = r.same or r
    if r.op == 'refund' and s.algorithm.refund then -- leases go back by release
      s.algorithm.refund(s.state, now, r.amount)
    elseif r.op == 'release' and s.algorithm.release then
      s.algorithm.release(s.state, now, r.lease_id, r.lease_units)
    end
  end

  -- 3. Decide each state for its demand (a peek asks about one unit).
  local admitted = true
  for i = lo, hi do
    local s = R[i]
    if not s.same then
      s.admits, s.wait = s.algorithm.decide(s.state, now, math.max(s.demand, 1))
      admitted = admitted and s.admits
    end
  end

  -- 4. All or nothing: consume only if every state admits.
  if admitted then
    for i = lo, hi do
      local s = R[i]
      if not s.same and s.demand > 0 then
        if s.algorithm.acquire then
          if s.lease_id then
            s.algorithm.acquire(s.state, now, s.demand, s.lease_id)
          end
        else
          s.algorithm.consume(s.state, now, s.demand)
        end
      end
    end
  end

  -- 5. Report.
  for i = lo, hi do
    local s = R[i].same or R[i]
    local remaining, reset_after = s.algorithm.report(s.state, now)
    local admits, retry_after = 0, 0
    if s.admits then
      admits = 1
    else
      retry_after = s.wait
    end
    reply[#reply + 1] = admits
    reply[#reply + 1] = remaining
    reply[#reply + 1] = reset_after
    reply[#reply + 1] = retry_after
  end
end

-- A lone check of `rule` on `key`: the phases of run() for one part of one rule, without their
-- tables. The checks of one rule reuse one slot and one state table (each algorithm's load
-- fills the one it is given), because making tables is much of what a script spends per
-- decision (see "Leaner scripts" in docs/benchmarks.md).
local function check(rule, key, cost)
  local slot = rule.slot
  if slot then
    slot.key, slot.had = key, 0
  else
    slot = {key = key, p = rule.p, had = 0}
    rule.slot = slot
  end
  local algorithm = rule.algorithm
  local st = algorithm.load(slot, now, rule.a, rule.b, rule.c, rule.d, rule.state)
  rule.state = st
  local admits, wait = algorithm.decide(st, now, math.max(cost, 1))
  if admits and cost > 0 and not algorithm.acquire then -- a lease is taken by acquire only
    algorithm.consume(st, now, cost)
  end
  local remaining, reset_after = algorithm.report(st, now)
  local n = #reply
  if admits then
    reply[n + 1] = 1
    reply[n + 4] = 0
  else
    reply[n + 1] = 0
    reply[n + 4] = wait
  end
  reply[n + 2] = remaining
  reply[n + 3] = reset_after
end

-- Reads the parts, running each group once it is complete.
local k, lo, parts_in_group = 0, 1, 0
local args = #ARGV
while at <= args do
  local op = ARGV[at]
  if op == 'r' then
    if parts_in_group > 0 then
      run(lo, k, parts_in_group > 1)
      parts_in_group = 0
    end
    local rule, n = RULES[tonumber(ARGV[at + 1])], tonumber(ARGV[at + 2])
    at = at + 3
    for _ = 1, n do
      k = k + 1
      check(rule, KEYS[k], tonumber(ARGV[at]))
      at = at + 1
    end
    lo = k + 1
  else
    local amount, lease_id = tonumber(ARGV[at + 1]), ARGV[at + 2]
    local lease_units = tonumber(ARGV[at + 3])
    local cost = 0
    if op == 'check' or op == 'acquire' then
      cost = amount
    end
    if ARGV[at + 4] ~= '1' and parts_in_group > 0 then -- a new group: run the one before
      run(lo, k, parts_in_group > 1)
      lo, parts_in_group = k + 1, 0
    end
    parts_in_group = parts_in_group + 1
    local n = tonumber(ARGV[at + 5])
    at = at + PART_HEADER
    for _ = 1, n do
      k = k + 1
      local rule = RULES[tonumber(ARGV[at])]
      -- every field it will hold, so the table is sized once (a rehash costs a reallocation)
      R[k] = {key = KEYS[k], p = rule.p, rule = rule, op = op, cost = cost, amount = amount,
              lease_id = lease_id, lease_units = lease_units, had = 0, algorithm = false,
              state = false, demand = 0, admits = false, wait = 0}
      at = at + 1
    end
  end
end
if parts_in_group > 0 then
  run(lo, k, parts_in_group > 1)
end
return reply
