-- Reset: forgets one key's state under one rule set, atomically (a script runs whole or not
-- at all), so a reset is never half done. Sent like a check (EVALSHA, EVAL where the node has
-- not got it), so on a cluster it follows the same redirections.
--
-- KEYS: the rule set's state keys, in the rules' order (all share the caller's hash tag).
-- ARGV: per key, the number of hash fields to drop from it, then those fields; 0 deletes the
-- key whole (a rule's own key). The shared hash keeps the fields of other rule sets.
local a = 1
for _, key in ipairs(KEYS) do
  local n = tonumber(ARGV[a])
  if n == 0 then
    redis.call('DEL', key)
  else
    redis.call('HDEL', key, unpack(ARGV, a + 1, a + n))
  end
  a = a + 1 + n
end
return 0
