"""The Lua scripts of the shared state in Redis (redis.py runs them): each one a
single atomic step on the keys docs/architecture.md#a-shared-state lists."""

from __future__ import annotations

NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) + tonumber(t[2]) / 1000000 "

# KEYS[1] zset; ARGV[1] ttl, ARGV[2..] members: push the deadline of existing members only.
RENEW = (
    NOW
    + """
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i]) end
return 0"""
)

# The same for a process's leases, adding any that a sweep took out while the process was
# too busy to renew them (it still runs those replies).
RENEW_LEASES = RENEW.replace("'XX', ", "")

# The same for presence, returning how many sockets it had to add back (a sweep dropped
# them while their process was too busy to renew): the room's online list changed.
RENEW_PRESENCE = (
    NOW
    + """
local added = 0
for i = 2, #ARGV do added = added + redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i]) end
return added"""
)

# KEYS[1] zset: take out the members whose deadline has passed, and return them (the
# caller alone now owns each: two processes sweeping at once never share one).
EXPIRED = (
    NOW
    + """
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, m in ipairs(gone) do redis.call('ZREM', KEYS[1], m) end
return gone"""
)

# KEYS[1] lease zset; ARGV[1] ttl, ARGV[2] member: a new lease.
LEASE = NOW + "redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2]) return 0"

# KEYS[1] the reply's text, KEYS[2] its hash; ARGV text, channel, payload: a piece recorded,
# then published, in one command (the order a snapshot on another process relies on, in one
# round trip); -1, and nothing done, once the reply has been ended (by another process).
# ARGV[4] is where the piece starts in the text's bytes: -2, and nothing done, when the text
# is gone or not the owner's (Redis restarted, or reloaded an older copy): the owner restores
# it whole; 0, and nothing done, when it already ends with this piece (a retried call).
APPEND_PUBLISH = """
if redis.call('HEXISTS', KEYS[2], 'ended') == 1 then return -1 end
if redis.call('EXISTS', KEYS[1]) == 0 then return -2 end
local have, at = redis.call('STRLEN', KEYS[1]), tonumber(ARGV[4])
if have == at + string.len(ARGV[1]) then return 0 end
if have ~= at then return -2 end
redis.call('APPEND', KEYS[1], ARGV[1])
if ARGV[2] == '' then return 0 end
return redis.call('PUBLISH', ARGV[2], ARGV[3])"""

# KEYS[1] text, KEYS[2] hash, KEYS[3] leases, KEYS[4] thinking; ARGV text, room, owner, state,
# keep_s, lease_s, reply, thinking: the owner puts a live reply's record back whole; -1, and
# nothing done, if another process has ended it meanwhile (a reply is never brought back to life).
RESTORE = (
    NOW
    + """
if redis.call('HEXISTS', KEYS[2], 'ended') == 1 then return -1 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[5])
redis.call('SET', KEYS[4], ARGV[8], 'EX', ARGV[5])
redis.call('HSET', KEYS[2], 'room', ARGV[2], 'owner', ARGV[3], 'state', ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[6]), ARGV[7])
return 0"""
)

# KEYS[1] room zset: the members whose deadline has not passed ("user:socket").
ONLINE = NOW + "return redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf')"

# KEYS[1] bucket; ARGV burst, refill_s: 1 when a token was taken.
TAKE = (
    NOW
    + """
local burst, refill = tonumber(ARGV[1]), tonumber(ARGV[2])
local s = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(s[1]) or burst, tonumber(s[2]) or now
tokens = math.min(burst, tokens + (now - at) / refill)
local ok = 0
if tokens >= 1 then tokens = tokens - 1 ok = 1 end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst * refill) + 1)
return ok"""
)

HAS_USER = """
local function has_user(key, prefix)
  for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    if string.sub(m, 1, #prefix) == prefix then return true end
  end
  return false
end
"""

# KEYS[1] room zset, KEYS[2] rooms set; ARGV member, ttl, "user:": 1 if the online list changed.
JOIN = (
    NOW
    + HAS_USER
    + """
local dropped = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local was = has_user(KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('SADD', KEYS[2], KEYS[1])
if dropped > 0 or not was then return 1 end
return 0"""
)

# KEYS[1] room zset; ARGV member, "user:": 1 if the online list changed.
LEAVE = (
    HAS_USER
    + """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
if has_user(KEYS[1], ARGV[2]) then return 0 end
return 1"""
)

# KEYS[1] rooms set: drop expired sockets; the room keys whose online list changed.
SWEEP_PRESENCE = (
    NOW
    + """
local changed = {}
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('ZREMRANGEBYSCORE', key, '-inf', now) > 0 then table.insert(changed, key) end
  if redis.call('ZCARD', key) == 0 then redis.call('SREM', KEYS[1], key) end
end
return changed"""
)

# KEYS holders, waiters (arrival order), alive (waiter deadlines), seq; ARGV token, cap, ttl.
# 0 when the slot is taken, else how many are ahead (1 = next).
ACQUIRE = (
    NOW
    + """
local token, cap, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
  redis.call('ZREM', KEYS[2], dead) redis.call('ZREM', KEYS[3], dead)
end
if not redis.call('ZSCORE', KEYS[2], token) then
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), token)
end
local free = cap - redis.call('ZCARD', KEYS[1])
local rank = redis.call('ZRANK', KEYS[2], token)
if rank < free then
  redis.call('ZREM', KEYS[2], token) redis.call('ZREM', KEYS[3], token)
  redis.call('ZADD', KEYS[1], now + ttl, token)
  return 0
end
redis.call('ZADD', KEYS[3], now + ttl, token)
return rank - math.max(free, 0) + 1"""
)
