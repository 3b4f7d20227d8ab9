"""The bus's Lua scripts: each is one atomic step in Redis (``store.BusStore`` runs them).

- ``REPLY_SCRIPT``: one reply per job id, the job's record, the done key, XACK and XDEL together.
- ``RESEND_SCRIPT``: a copy of an answered job (a client's retry) gets that one reply again, marked resent.
- ``PRUNE_SCRIPT``: forget an address whose job stream is gone or empty.
- ``SUBMIT_SCRIPT``: put a job on its stream and note its address.
"""

REPLY_SCRIPT = """
-- KEYS: job stream, done key, reply stream ('' when unreadable), dead stream, records stream ('' = no record),
-- records dropped counter.
-- ARGV: group, entry id, done ttl, reply maxlen, reply ttl, dead maxlen, dead json ('' = none), token,
-- record ('' = none), records bound, the request's digest and client id ('digest\\nclient id'), reply k/v...
-- Writes the reply (and the job's record) only when the done key is new, XACKs and XDELs the job either way. The
-- check comes before the writes, and the done key is set last: a failed XADD leaves the job pending, never
-- half-done. The record goes to the records stream with the reply's own fields, unless the stream holds its bound
-- (then the counter counts it). The done key holds the caller's token (one per finish, kept across its retries),
-- then the request's digest, client id and the reply's entry id, each after a newline, for RESEND_SCRIPT (the
-- reply stream is the client id's, so the value stays short): 1 = this call wrote the reply, 2 = an earlier try
-- of this same call did (its answer was lost), 0 = someone else did.
local held = redis.call('GET', KEYS[2])
local first = not held
local sep = '\\n'
if first then
  local where = ''
  if ARGV[7] ~= '' then
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'entry', ARGV[2], 'job', ARGV[7])
  end
  if KEYS[3] ~= '' then
    local reply = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', unpack(ARGV, 12))
    redis.call('EXPIRE', KEYS[3], ARGV[5])
    if ARGV[11] ~= '' then where = sep .. ARGV[11] .. sep .. reply end
  end
  if KEYS[5] ~= '' then
    if redis.call('XLEN', KEYS[5]) < tonumber(ARGV[10]) then
      redis.call('XADD', KEYS[5], '*', 'r', ARGV[9], unpack(ARGV, 12))
    else
      redis.call('INCR', KEYS[6])
    end
  end
  redis.call('SET', KEYS[2], ARGV[8] .. where, 'EX', ARGV[3])
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
if first then return 1 end
if held == ARGV[8] or string.sub(held, 1, #ARGV[8] + 1) == ARGV[8] .. sep then return 2 end
return 0
"""
"""One reply (and one record) per job id, however often the job was delivered. Acked entries are deleted at
once: Redis 6.2 has no ACKED trim, and deleting exactly what was acked, in the same atomic step, never drops
a pending job. The record is written with the reply or not at all: served and recorded cannot part."""

RESEND_SCRIPT = """
-- KEYS: job stream, the stream the job id's reply went to ('' = none to resend), the copy's reply stream.
-- ARGV: group, entry id, the reply's entry id, the copy's key id, reply maxlen, reply ttl.
-- The caller checked that the copy asks what the first try asked (the done key's digest) and is allowed.
-- The reply written for this job id, if it is still there and was signed for the copy's key id, goes to the
-- copy's reply stream again with 'resent' '1' added (outside the signature): the same answer, never a second
-- one. XACKs and XDELs the copy either way. Only a copy still pending is answered: an entry acked already (the
-- same entry, reclaimed and answered by another bridge while this one stalled) had its reply. Returns 1 when it
-- resent the reply.
local sent = 0
local pending = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if pending == 1 and KEYS[2] ~= '' then
  local found = redis.call('XRANGE', KEYS[2], ARGV[3], ARGV[3])
  if #found == 1 then
    local fields = found[1][2]
    local key = nil
    for i = 1, #fields, 2 do
      if fields[i] == 'key' then key = fields[i + 1] end
    end
    if key == ARGV[4] then
      table.insert(fields, 'resent')
      table.insert(fields, '1')
      redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', unpack(fields))
      redis.call('EXPIRE', KEYS[3], ARGV[6])
      sent = 1
    end
  end
end
redis.call('XDEL', KEYS[1], ARGV[2])
return sent
"""
"""A retry with a job id already answered gets that answer, not silence, and is never served again. The reply is
read where it was written (its stream lives ``bus.reply_ttl_s``, 600 s by default), so the done key holds a
location, not a copy; a reply expired or trimmed from there is not resent. With KEYS[2] '' it only acks the copy."""

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
