"""The bus's Lua scripts: each is one atomic step in Redis (``store.BusStore`` runs them).

- ``REPLY_SCRIPT``: one reply per job id, the job's record, the done key, XACK and XDEL together.
- ``PRUNE_SCRIPT``: forget an address whose job stream is gone or empty.
- ``SUBMIT_SCRIPT``: put a job on its stream and note its address.
"""

REPLY_SCRIPT = """
-- KEYS: job stream, done key, reply stream ('' when unreadable), dead stream, records stream ('' = no record),
-- records dropped counter.
-- ARGV: group, entry id, done ttl, reply maxlen, reply ttl, dead maxlen, dead json ('' = none), token,
-- record ('' = none), records bound, reply k/v... Writes the reply (and the job's record) only when the done
-- key is new, XACKs and XDELs the job either way. The check comes before the writes, and the done key is set
-- last: a failed XADD leaves the job pending, never half-done. The record goes to the records stream with the
-- reply's own fields, unless the stream holds its bound (then the counter counts it). The done key holds the
-- caller's token (one per finish, kept across its retries): 1 = this call wrote the reply, 2 = an earlier try
-- of this same call did (its answer was lost), 0 = someone else did.
local held = redis.call('GET', KEYS[2])
local first = not held
if first then
  if ARGV[7] ~= '' then
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'entry', ARGV[2], 'job', ARGV[7])
  end
  if KEYS[3] ~= '' then
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', unpack(ARGV, 11))
    redis.call('EXPIRE', KEYS[3], ARGV[5])
  end
  if KEYS[5] ~= '' then
    if redis.call('XLEN', KEYS[5]) < tonumber(ARGV[10]) then
      redis.call('XADD', KEYS[5], '*', 'r', ARGV[9], unpack(ARGV, 11))
    else
      redis.call('INCR', KEYS[6])
    end
  end
  redis.call('SET', KEYS[2], ARGV[8], 'EX', ARGV[3])
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
if first then return 1 elseif held == ARGV[8] then return 2 else return 0 end
"""
"""One reply (and one record) per job id, however often the job was delivered. Acked entries are deleted at
once: Redis 6.2 has no ACKED trim, and deleting exactly what was acked, in the same atomic step, never drops
a pending job. The record is written with the reply or not at all: served and recorded cannot part."""

PRUNE_SCRIPT = """
-- KEYS: job stream, addresses set. ARGV: address. Forgets an address whose stream is gone or empty, in one
-- step with the check, so a job submitted meanwhile (SADD and XADD in one script too) is never missed.
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('XLEN', KEYS[1]) == 0 then
  return redis.call('SREM', KEYS[2], ARGV[1])
end
return 0
"""

SUBMIT_SCRIPT = """
-- KEYS: job stream, addresses set. ARGV: address, stream maxlen, job k/v...
-- Notes the address, so bridges find the streams of unknown addresses with SMEMBERS instead of a SCAN of
-- a keyspace that holds a done key per job; the same round trip as the XADD alone.
redis.call('SADD', KEYS[2], ARGV[1])
return redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))
"""
