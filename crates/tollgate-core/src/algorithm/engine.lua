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
CLOCK_IS_REDIS = not now
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end

local reply = {now}
-- Every part's rules, in order: {key, p (field prefix), at (its first argument), and its
-- part's op, cost, amount and lease}. A rule table is also the rule's slot (see hload) and holds its
-- state; in a group where several parts name one state, the later ones point at the first
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
      local at = r.at
      r.algorithm = ALGORITHMS[tonumber(ARGV[at])]
      r.state = r.algorithm.load(r, now, tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]),
                                 tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4]))
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

-- Reads the parts, running each group once it is complete.
local at, k, lo, parts_in_group = 2, 0, 1, 0
local args = #ARGV
while at <= args do
  local op, amount, lease_id = ARGV[at], tonumber(ARGV[at + 1]), ARGV[at + 2]
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
    -- every field it will hold, so the table is sized once (a rehash costs a reallocation)
    R[k] = {key = KEYS[k], p = ARGV[at + 5], at = at, op = op, cost = cost, amount = amount,
            lease_id = lease_id, lease_units = lease_units, had = 0, algorithm = false,
            state = false, demand = 0, admits = false, wait = 0}
    at = at + PER_RULE
  end
end
if parts_in_group > 0 then
  run(lo, k, parts_in_group > 1)
end
return reply
