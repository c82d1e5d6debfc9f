-- Runs the parts of a call, in the phases of crates/tollgate-core/src/engine.rs (run_group):
-- parts of one group are all or nothing; groups run one after another.
--
-- KEYS and ARGV are laid out as the module docs of crates/tollgate-core/src/script.rs say. The
-- layout's sizes and operation codes are written here by their names in script.rs, which
-- replaces each by its value when it assembles the script. All keys share one hash tag on
-- Redis Cluster, so this runs there unchanged.
-- Reply: {now, then per part and rule: admitted (1 or 0), remaining, reset_after,
--   retry_after}, times in microseconds.
--
-- Everything here is defined once and called through `decide(KEYS, ARGV)`: a script (EVALSHA)
-- ends with `return decide(KEYS, ARGV)`, so it defines it all anew on every call; a Redis
-- Functions library registers `decide` as its function, so its definitions are made once, at
-- FUNCTION LOAD, and live on between calls. The state of a call (`now`, `reply`, ...) is
-- therefore set at the start of every call, never assumed fresh.

-- The call's time (microseconds), reply, and entries (see decide).
-- `entries`: every part's rules, in order, one entry each: {key, prefix, its rule, and its
-- part's op, cost, amount and lease}. An entry is also its state's location (see hload) and
-- holds the state, unless the group plan says an earlier entry of the group names the same
-- state: then `owner` is that entry, which loads the state once and sums the demand on it.
-- (The plan is GroupPlan in crates/tollgate-core/src/plan.rs, sent by script.rs's arguments:
-- an entry with an owner is one whose state GroupPlan::add_entry found, an entry without one
-- is one it added.)
local now, reply, entries = 0, false, false
-- The seconds of Redis's clock last read, as TIME gives them and in microseconds.
local clock_text, clock_seconds = false, 0

-- Runs the entries entries[first..last], one group's; `joint` when the group has several parts
-- (only then may an entry have an owner), in the phases of engine.rs's `phases`.
local function run(first, last, joint)
  -- 1. The group plan and the refresh. The plan takes the steps of GroupPlan::add_entry
  -- (crates/tollgate-core/src/plan.rs) for each entry in order: the entry's state is its
  -- owner's (a state the plan found) or its own (one it added, loaded here, which refreshes
  -- it); the entry's cost is added to the state's demand, and an acquire's lease becomes the
  -- state's lease. (GroupPlan's capacity check is made before a call is sent: BatchPlan
  -- refuses a group asking a state for more than its capacity.)
  for i = first, last do
    local entry = entries[i]
    local owner = entry
    if joint then
      owner = entry.owner or entry
    end
    if owner == entry then
      local rule = entry.rule
      entry.algorithm = rule.algorithm
      entry.state = entry.algorithm.load(entry, now, rule.param1, rule.param2, rule.param3, rule.param4)
      entry.demand = 0
    end
    owner.demand = owner.demand + entry.cost
    if entry.op == OP_ACQUIRE then
      owner.lease_id = entry.lease_id
    end
  end

  -- 2. Refunds and releases (an algorithm without one gives nothing back: see algorithm/mod.rs).
  for i = first, last do
    local entry = entries[i]
    local owner = entry.owner or entry
    if entry.op == OP_REFUND and owner.algorithm.refund then
      owner.algorithm.refund(owner.state, now, entry.amount)
    elseif entry.op == OP_RELEASE and owner.algorithm.release then
      owner.algorithm.release(owner.state, now, entry.lease_id, entry.lease_units)
    end
  end

  -- 3. Decide each state for its demand (a peek asks about one unit).
  local admitted = true
  for i = first, last do
    local entry = entries[i]
    if not entry.owner then
      entry.admits, entry.wait = entry.algorithm.decide(entry.state, now, math.max(entry.demand, 1))
      admitted = admitted and entry.admits
    end
  end

  -- 4. All or nothing: consume only if every state admits.
  if admitted then
    for i = first, last do
      local entry = entries[i]
      if not entry.owner and entry.demand > 0 then
        entry.algorithm.consume(entry.state, now, entry.demand, entry.lease_id)
      end
    end
  end

  -- 5. Report.
  for i = first, last do
    local owner = entries[i].owner or entries[i]
    local remaining, reset_after = owner.algorithm.report(owner.state, now)
    local admits, retry_after = 0, 0
    if owner.admits then
      admits = 1
    else
      retry_after = owner.wait
    end
    reply[#reply + 1] = admits
    reply[#reply + 1] = remaining
    reply[#reply + 1] = reset_after
    reply[#reply + 1] = retry_after
  end
end

-- A lone check of `rule` on `key`: the phases of run() for one part of one rule, without their
-- tables. The checks of one rule reuse one location and one state table (each algorithm's load
-- fills the one it is given), because making tables is much of what a script spends per
-- decision (see "Leaner scripts" in docs/benchmarks.md).
local function check(rule, key, cost)
  local location = rule.location
  if location then
    location.key, location.had = key, 0
  else
    location = {key = key, prefix = rule.prefix, had = 0}
    rule.location = location
  end
  local algorithm = rule.algorithm
  local st = algorithm.load(location, now, rule.param1, rule.param2, rule.param3, rule.param4, rule.state)
  rule.state = st
  local admits, wait = algorithm.decide(st, now, math.max(cost, 1))
  if admits and cost > 0 then -- without a lease, a lease-holding algorithm takes nothing
    algorithm.consume(st, now, cost, false)
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

-- The lone check's tables, kept between the calls of a library (a script makes them anew):
-- its location, a state table per algorithm number (each algorithm's load fills every field of
-- the one it is given), and its reply.
local lone_location, lone_states, lone_reply = false, false, false
-- The rule (ARGV[RULES_AT..LONE_PREFIX - 1]) and cost (ARGV[LONE_COST]) of the last lone
-- check, as sent and as numbers: a library's calls mostly repeat them, and comparing Lua
-- strings (interned) costs next to nothing where tonumber costs about 1,500 instructions each
-- (measured with callgrind).
local sent_number, sent1, sent2, sent3, sent4, sent_cost = false, false, false, false, false, false
local number, param1, param2, param3, param4, cost = 0, 0, 0, 0, 0, 0

-- A call of one lone check, the most common call (ARGV: now, 1 rule, the rule, OP_RUN, 1, 1,
-- the cost): check() without the rule tables, its tables reused. Returns the reply.
local function lone(KEYS, ARGV)
  if not lone_location then
    lone_location, lone_states, lone_reply = {key = false, prefix = '', had = 0}, {}, {0, 0, 0, 0, 0}
  end
  -- (positions written as sums of the layout's constants, which Lua's compiler folds)
  if ARGV[RULES_AT] ~= sent_number or ARGV[RULES_AT + 1] ~= sent1 or ARGV[RULES_AT + 2] ~= sent2
      or ARGV[RULES_AT + 3] ~= sent3 or ARGV[RULES_AT + 4] ~= sent4 then
    sent_number, sent1, sent2 = ARGV[RULES_AT], ARGV[RULES_AT + 1], ARGV[RULES_AT + 2]
    sent3, sent4 = ARGV[RULES_AT + 3], ARGV[RULES_AT + 4]
    number, param1, param2 = tonumber(sent_number), tonumber(sent1), tonumber(sent2)
    param3, param4 = tonumber(sent3), tonumber(sent4)
  end
  if ARGV[LONE_COST] ~= sent_cost then
    sent_cost = ARGV[LONE_COST]
    cost = tonumber(sent_cost)
  end
  local algorithm = ALGORITHMS[number]
  local location = lone_location
  location.key, location.prefix, location.had = KEYS[1], ARGV[LONE_PREFIX], 0
  local st = algorithm.load(location, now, param1, param2, param3, param4, lone_states[number])
  lone_states[number] = st
  local admits, wait = algorithm.decide(st, now, math.max(cost, 1))
  if admits and cost > 0 then -- without a lease, a lease-holding algorithm takes nothing
    algorithm.consume(st, now, cost, false)
  end
  local remaining, reset_after = algorithm.report(st, now)
  local out = lone_reply
  out[1], out[3], out[4] = now, remaining, reset_after
  if admits then
    out[2], out[5] = 1, 0
  else
    out[2], out[5] = 0, wait
  end
  return out
end

-- Decides a call: sets the call's state, then reads the parts, running each group once it is
-- complete.
local function decide(KEYS, ARGV)
  now = tonumber(ARGV[1])
  CLOCK_IS_REDIS = not now
  if not now then
    local time = redis.call('TIME')
    -- (the seconds, parsed once a second in a library: see int in the prelude)
    if time[1] ~= clock_text then
      clock_text, clock_seconds = time[1], tonumber(time[1]) * 1000000
    end
    now = clock_seconds + tonumber(time[2])
  end
  local args = #ARGV
  if args == LONE_COST and ARGV[RULES_AT + PER_RULE] == OP_RUN then
    TTL_COVERS = false
    return lone(KEYS, ARGV)
  end
  -- (a new table: an earlier call's, in a library, may hold keys, as one that failed part way)
  TTL_COVERS = {}

  -- The rules, parsed once: {algorithm, its four parameters, field prefix, and the location and
  -- state tables that lone checks of the rule reuse (see check)}.
  local RULES = {}
  local at = RULES_AT
  for i = 1, tonumber(ARGV[2]) do
    RULES[i] = {algorithm = ALGORITHMS[tonumber(ARGV[at])], param1 = tonumber(ARGV[at + 1]),
                param2 = tonumber(ARGV[at + 2]), param3 = tonumber(ARGV[at + 3]),
                param4 = tonumber(ARGV[at + 4]), prefix = ARGV[at + 5], location = false,
                state = false}
    at = at + PER_RULE
  end
  reply, entries = {now}, {}
  local k, first, parts_in_group = 0, 1, 0
  while at <= args do
    local op = ARGV[at]
    if op == OP_RUN then
      if parts_in_group > 0 then
        run(first, k, parts_in_group > 1)
        parts_in_group = 0
      end
      local rule, n = RULES[tonumber(ARGV[at + 1])], tonumber(ARGV[at + 2])
      at = at + RUN_HEADER
      for _ = 1, n do
        k = k + 1
        check(rule, KEYS[k], tonumber(ARGV[at]))
        at = at + 1
      end
      first = k + 1
    else
      local amount, lease_id = tonumber(ARGV[at + 1]), ARGV[at + 2]
      local lease_units = tonumber(ARGV[at + 3])
      local cost = 0
      if op == OP_CHECK or op == OP_ACQUIRE then
        cost = amount
      end
      if ARGV[at + 4] ~= '1' and parts_in_group > 0 then -- a new group: run the one before
        run(first, k, parts_in_group > 1)
        first, parts_in_group = k + 1, 0
      end
      parts_in_group = parts_in_group + 1
      local n = tonumber(ARGV[at + 5])
      at = at + PART_HEADER
      for _ = 1, n do
        k = k + 1
        -- the group plan: a rule's number, or -j for the state of the group's j-th entry
        local planned = tonumber(ARGV[at])
        local rule, owner = RULES[planned], nil
        if not rule then -- -j: the state of the group's j-th entry
          owner = entries[first - 1 - planned]
          rule = owner.rule
        end
        -- every field it will hold, so the table is sized once (a rehash costs a reallocation;
        -- `owner`, rare, fits in the room left)
        local entry = {key = KEYS[k], prefix = rule.prefix, rule = rule, op = op, cost = cost,
                       amount = amount, lease_id = lease_id, lease_units = lease_units, had = 0,
                       algorithm = false, state = false, demand = 0, admits = false, wait = 0}
        if owner then
          entry.owner = owner
        end
        entries[k] = entry
        at = at + 1
      end
    end
  end
  if parts_in_group > 0 then
    run(first, k, parts_in_group > 1)
  end
  return reply
end
