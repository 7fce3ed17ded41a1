"""The Lua scripts of the Redis dead-letter store (``_redis_dlq``): ``save``, the
status changes, ``delete``, the backlog count, the index cleanup and the purge, each
atomic on the server. The keys they touch are described in ``_redis_dlq``'s
docstring."""

from __future__ import annotations

# KEYS: entry, stream zset, pending zset, expiry zset, streams set.
# ARGV: prefix, id, stream, createdAt ms, expiresAt ms or "", status, field, value, ...
SAVE = """
local prefix, id, stream, expires = ARGV[1], ARGV[2], ARGV[3], ARGV[5]
local old = redis.call('HGET', KEYS[1], 'streamName')
if old and old ~= stream then
  redis.call('ZREM', prefix .. 'dlq:stream:' .. old, id)
  redis.call('ZREM', prefix .. 'dlq:pending:' .. old, id)
  redis.call('ZREM', prefix .. 'dlq:expiry:' .. old, id)
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 7))
redis.call('ZADD', KEYS[2], ARGV[4], id)
if ARGV[6] == 'PENDING' then
  redis.call('ZADD', KEYS[3], expires == '' and '+inf' or expires, id)
else
  redis.call('ZREM', KEYS[3], id)
end
redis.call('SADD', KEYS[5], stream)
if expires == '' then
  redis.call('ZREM', KEYS[4], id)
else
  redis.call('ZADD', KEYS[4], expires, id)
  redis.call('PEXPIREAT', KEYS[1], expires)
end
return 1
"""

# KEYS: entry. ARGV: prefix, id, new status, "1" to count a replay, n, n expected
# statuses, then field, value, ... to set. Returns 1 when the status matched.
CHANGE_STATUS = """
local prefix, id, to = ARGV[1], ARGV[2], ARGV[3]
local state = redis.call('HMGET', KEYS[1], 'status', 'streamName', 'expiresAt')
if not state[1] then return 0 end
local n = tonumber(ARGV[5])
local allowed = false
for i = 6, 5 + n do
  if ARGV[i] == state[1] then allowed = true end
end
if not allowed then return 0 end
redis.call('HSET', KEYS[1], 'status', to, unpack(ARGV, 6 + n))
if ARGV[4] == '1' then redis.call('HINCRBY', KEYS[1], 'replayCount', 1) end
local pending = prefix .. 'dlq:pending:' .. state[2]
if to == 'PENDING' then
  local expires = state[3]
  if not expires or expires == '' then expires = '+inf' end
  redis.call('ZADD', pending, expires, id)
else
  redis.call('ZREM', pending, id)
end
return 1
"""

# KEYS: entry. ARGV: prefix, id.
DELETE = """
local stream = redis.call('HGET', KEYS[1], 'streamName')
redis.call('DEL', KEYS[1])
if stream then
  redis.call('ZREM', ARGV[1] .. 'dlq:stream:' .. stream, ARGV[2])
  redis.call('ZREM', ARGV[1] .. 'dlq:pending:' .. stream, ARGV[2])
  redis.call('ZREM', ARGV[1] .. 'dlq:expiry:' .. stream, ARGV[2])
end
return 1
"""

# KEYS: pending zset. The entries Redis expired leave the backlog first.
COUNT_PENDING = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%d', ms))
return redis.call('ZCARD', KEYS[1])
"""

# KEYS: stream zset. ARGV: prefix, stream, ids seen without a hash of this stream.
# Checked again here: the id may have been saved again since it was read.
DROP_STALE = """
local removed = 0
for i = 3, #ARGV do
  local owner = redis.call('HGET', ARGV[1] .. 'dlq:' .. ARGV[i], 'streamName')
  if owner ~= ARGV[2] then removed = removed + redis.call('ZREM', KEYS[1], ARGV[i]) end
end
return removed
"""

# KEYS: streams set. ARGV: prefix, now ms, batch size.
# Returns {purged, examined}: entries whose expiresAt < now are deleted (or were
# deleted by Redis already) and leave every index.
PURGE = """
local prefix, now, budget = ARGV[1], ARGV[2], tonumber(ARGV[3])
local purged, examined = 0, 0
for _, stream in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if examined >= budget then break end
  local expiry = prefix .. 'dlq:expiry:' .. stream
  local ids = redis.call('ZRANGEBYSCORE', expiry, '-inf', '(' .. now, 'LIMIT', 0, budget - examined)
  for _, id in ipairs(ids) do
    examined = examined + 1
    local key = prefix .. 'dlq:' .. id
    local owner = redis.call('HGET', key, 'streamName')
    if owner == false or owner == stream then
      redis.call('DEL', key)
      purged = purged + 1
    end
    redis.call('ZREM', expiry, id)
    redis.call('ZREM', prefix .. 'dlq:stream:' .. stream, id)
    redis.call('ZREM', prefix .. 'dlq:pending:' .. stream, id)
  end
  if redis.call('EXISTS', prefix .. 'dlq:stream:' .. stream) == 0 then
    redis.call('SREM', KEYS[1], stream)
  end
end
return {purged, examined}
"""
