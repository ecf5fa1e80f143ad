-- ---- request/response tracking, drop reason, body parts ----
hf["request_in"] = ProtoField.framenum("embnic.request_in", "Request in", base.NONE, frametype.REQUEST)
hf["response_in"] = ProtoField.framenum("embnic.response_in", "Response in", base.NONE, frametype.RESPONSE)
hf["time"] = ProtoField.relative_time("embnic.time", "Time since request")
hf["drop_reason"] = ProtoField.string("embnic.drop_reason", "Drop reason")
hf["partial"] = ProtoField.bytes("embnic.partial", "Part of an element cut by a fragment boundary")
hf["undecoded"] = ProtoField.bytes("embnic.undecoded", "Rows of tables not known (no directory seen)")
hf["directory_in"] = ProtoField.framenum("embnic.directory_in", "Directory completed in", base.NONE)
hf["gso_frame"] = ProtoField.uint16("embnic.gso_frame", "Frame of a UDP GSO send", base.DEC, nil, nil,
                                    "this frame's place in a datagram its sender's kernel cuts into frames")
hf["gso_size"] = ProtoField.uint32("embnic.gso_size", "GSO frame size", base.DEC, nil, nil,
                                   "bytes of every frame of the GSO send but its last")
local expert_no_request = ProtoExpert.new("embnic.expert.no_request", "Reply to no request in this capture",
                                          expert.group.SEQUENCE, expert.severity.NOTE)
local expert_bad_directory = ProtoExpert.new("embnic.expert.bad_directory", "Directory does not add up",
                                             expert.group.MALFORMED, expert.severity.WARN)

local fields, experts = {}, { expert_no_request, expert_bad_directory }
for _, f in pairs(hf) do fields[#fields + 1] = f end
for _, e in pairs(expert_of) do experts[#experts + 1] = e end
embnic.fields = fields
embnic.experts = experts

-- ---- the fixed code: interprets the tables above ----
local function half(r)  -- IEEE-754 binary16, little-endian
    local u = r:le_uint()
    local sign = (u >= 0x8000) and -1 or 1
    local e = math.floor(u / 0x400) % 0x20
    local m = u % 0x400
    if e == 0 then return sign * m * 2^-24 end
    if e == 31 then
        if m == 0 then return sign * math.huge end
        return 0 / 0
    end
    return sign * (1 + m / 1024) * 2^(e - 15)
end
local READERS = { half = half, float = function(r) return r:le_float() end }
for d, reader in pairs(VALUE_READER) do VALUE_READER[d] = READERS[reader] end

-- bytes of one element; a row's from its table's directory entry `ent`
local function element_size(e, ent)
    if e.kind == "values" then return ent[e.count] * (DTYPE_SIZE[ent[e.dtype]] or 0) end
    return e.size
end

local function count_of(s, h)
    if type(s.count) == "number" then return s.count end
    return h[s.count]
end

-- bytes of a section of this header's message
local function section_size(s, h)
    if s.nbytes then return h[s.nbytes] end
    return count_of(s, h) * ELEMENT[s.element].size
end

-- body bytes a message of this header must have: its sections back to back (expected_msg_len)
local function body_size(h)
    local n = 0
    for _, s in ipairs(LAYOUT[h.msg_type]) do n = n + section_size(s, h) end
    return n
end

local OPS = { [">="] = function(a, b) return a >= b end, ["=="] = function(a, b) return a == b end }

-- docs/protocol.md "Validity" past the single-field checks, in the card's order (its
-- embnic_check_lengths: codec.parse_header's checks, then the fragment's geometry, which the
-- client checks in reassembly.fragment_size): returns reason, detail, the field to flag; nil
-- when the frame adds up
local function check_geometry(h, body_len)
    if h.frag_len ~= body_len then
        return "bad_length", string.format("frag_len %d != %d body bytes", h.frag_len, body_len), "frag_len"
    end
    if h.frag_count == 0 or h.frag_index >= h.frag_count then
        return "bad_length", string.format("frag %d/%d", h.frag_index, h.frag_count), "frag_index"
    end
    if h.frag_offset + h.frag_len > h.msg_len then
        return "bad_length", string.format("frag_offset+frag_len %d > msg_len %d", h.frag_offset + h.frag_len,
                                           h.msg_len), "frag_offset"
    end
    local want = body_size(h)
    if h.msg_len ~= want then
        return "bad_length", string.format("msg_len %d != %d for the header's counts", h.msg_len, want), "msg_len"
    end
    for _, r in ipairs(COUNT_RULES[h.msg_type] or {}) do
        local bound = r.k * (r.other and h[r.other] or 1)
        if not OPS[r.op](h[r.field], bound) then
            local rhs = r.other and string.format("%d*%s (%d)", r.k, r.other, bound) or tostring(r.k)
            return "bad_length", string.format("%s %d, not %s %s in a %s", r.field, h[r.field], r.op, rhs,
                                               TYPE_NAMES[h.msg_type]), r.field
        end
    end
    if h.frag_count > MAX_FRAGS then
        return "too_many_frags", string.format("frag_count %d > %d", h.frag_count, MAX_FRAGS), "frag_count"
    end
    -- the fragment's offset and length against its index (embnic_check_lengths, the client's
    -- fragment_size): fragment i carries [i*P, (i+1)*P), the last one the rest (1..P bytes)
    local last, stop = h.frag_count - 1, h.frag_offset + h.frag_len
    if last == 0 then
        if h.frag_offset ~= 0 or stop ~= h.msg_len then
            return "frag_mismatch", string.format("the only fragment carries bytes %d..%d of %d", h.frag_offset,
                                                  stop, h.msg_len), "frag_offset"
        end
    elseif h.frag_index < last then
        local p = h.frag_len
        if p == 0 or h.frag_index * p ~= h.frag_offset or last * p >= h.msg_len or h.frag_count * p < h.msg_len then
            return "frag_mismatch", string.format("fragment %d/%d of %d bytes at offset %d: not fragment %d of %d "
                                                  .. "bytes cut at %d", h.frag_index, h.frag_count, p, h.frag_offset,
                                                  h.frag_index, h.msg_len, p), "frag_offset"
        end
    else
        if stop ~= h.msg_len or h.frag_offset % last ~= 0 or h.frag_len == 0
           or h.frag_len > h.frag_offset / last then
            return "frag_mismatch", string.format("last fragment %d/%d at offset %d, %d bytes: not the rest of %d "
                                                  .. "bytes after %d fragments of offset/index bytes", h.frag_index,
                                                  h.frag_count, h.frag_offset, h.frag_len, h.msg_len, last),
                   "frag_offset"
        end
    end
    return nil
end

-- ---- directories: the first pass collects each request's directory bytes by message ----
-- (MESSAGE_FIELDS, equal in all its fragments); a frame is read with the directory complete
-- when the first pass reached it (its own message's, or for a reply its request's)
local msgs, frame_state, tx_by_key = {}, {}, {}
function embnic.init()
    msgs, frame_state, tx_by_key = {}, {}, {}
end

local function message_of(h)
    local parts = {}
    for _, k in ipairs(MESSAGE_FIELDS) do parts[#parts + 1] = tostring(h[k]) end
    local key = table.concat(parts, ":")
    local m = msgs[key]
    if m == nil then
        m = { frag_count = h.frag_count, bytes = {}, have = 0 }
        msgs[key] = m
    end
    return m
end

-- body offset and size of the directory section of this header's message (nil: it has none)
local function directory_section(h)
    local start = 0
    for _, s in ipairs(LAYOUT[h.msg_type]) do
        if s.element == DIRECTORY.element then return start, section_size(s, h) end
        start = start + section_size(s, h)
    end
    return nil
end

local function le_bytes(b, p, n)
    local v = 0
    for i = n - 1, 0, -1 do v = v * 256 + b[p + i] end
    return v
end

-- the entries of a complete directory (bytes: body offset -> byte); .fault says which entry does
-- not add up (codec.parse_request_body: a table twice, then an entry without keys, dim or dtype)
local function parse_directory(b, n, frame)
    local e = ELEMENT[DIRECTORY.element]
    local dir, seen = { frame = frame }, {}
    for i = 0, n - 1 do
        local ent = {}
        for _, f in ipairs(e.fields) do ent[f.name] = le_bytes(b, i * e.size + f.offset, f.size) end
        dir[#dir + 1] = ent
        local t = ent[DIRECTORY.table]
        if seen[t] and dir.fault == nil then dir.fault = string.format("table %d appears twice", t) end
        seen[t] = true
    end
    for _, ent in ipairs(dir) do
        if dir.fault then break end
        local esz = DTYPE_SIZE[ent[DIRECTORY.dtype]] or 0
        if ent[DIRECTORY.per_table] < 1 or ent[DIRECTORY.dim] < 1 or esz == 0 then
            dir.fault = string.format("table %d: %s %d, %s %d, %s %d", ent[DIRECTORY.table], DIRECTORY.per_table,
                                      ent[DIRECTORY.per_table], DIRECTORY.dim, ent[DIRECTORY.dim], DIRECTORY.dtype,
                                      ent[DIRECTORY.dtype])
        end
    end
    return dir
end

-- why `dir` cannot be read with this header (nil: it fits): its own fault, or its counts and
-- row bytes are not the header's
local function directory_fault(dir, h)
    if dir.fault then return dir.fault end
    if #dir ~= h[DIRECTORY.count] then
        return string.format("%d tables, the header's %s %d", #dir, DIRECTORY.count, h[DIRECTORY.count])
    end
    local total = 0
    for _, ent in ipairs(dir) do total = total + ent[DIRECTORY.per_table] end
    if total ~= h[DIRECTORY.total] then
        return string.format("%d keys, the header's %s %d", total, DIRECTORY.total, h[DIRECTORY.total])
    end
    local rows = 0
    for _, ent in ipairs(dir) do
        rows = rows + ent[DIRECTORY.per_table] * ent[DIRECTORY.dim] * (DTYPE_SIZE[ent[DIRECTORY.dtype]] or 0)
    end
    if rows ~= h[DIRECTORY.rows] then
        return string.format("%d bytes of rows, the header's %s %d", rows, DIRECTORY.rows, h[DIRECTORY.rows])
    end
    for _, s in ipairs(LAYOUT[h.msg_type]) do
        if s.per_table then
            local n, e = 0, ELEMENT[s.element]
            for _, ent in ipairs(dir) do n = n + ent[s.per_table] * element_size(e, ent) end
            if n ~= section_size(s, h) then
                return string.format("%d bytes of %s, the header's %d", n, s.name, section_size(s, h))
            end
        end
    end
    return nil
end

-- first pass, a request frame: add its directory bytes to its message; the message
local function collect_directory(tvb, h, pinfo)
    local ds, dsize = directory_section(h)
    if ds == nil then return nil end
    local m = message_of(h)
    if m.dir == nil then
        local lo = h.frag_offset
        local a = math.max(ds, lo)
        local b = math.min(ds + dsize, lo + math.min(h.frag_len, tvb:len() - HDR_LEN))
        if a < b then
            local raw = tvb:raw(HDR_LEN + a - lo, b - a)
            for i = 1, b - a do
                local p = a + i - 1 - ds
                if m.bytes[p] == nil then
                    m.bytes[p] = raw:byte(i)
                    m.have = m.have + 1
                end
            end
        end
        if m.have == dsize then
            m.dir = parse_directory(m.bytes, h[DIRECTORY.count], pinfo.number)
            m.bytes = nil
        end
    end
    return m
end

-- first pass: a transaction is a request message's frames and its reply's, matched by
-- TRANSACTION_KEY and ANSWERS; a request after the reply began starts a new one (a
-- retransmission). Returns the frame's state: its transaction, directory, request message.
local function first_pass(tvb, h, pinfo)
    local parts = {}
    for _, k in ipairs(TRANSACTION_KEY) do parts[#parts + 1] = tostring(h[k]) end
    local key = table.concat(parts, ":")
    local tx = tx_by_key[key]
    local st = {}
    if REQUEST[h.msg_type] then
        if tx == nil or tx.response ~= nil or tx.req_type ~= h.msg_type then
            tx = { request = pinfo.number, req_type = h.msg_type, req_ts = pinfo.abs_ts }
            tx_by_key[key] = tx
        end
        local m = collect_directory(tvb, h, pinfo)
        if m ~= nil then tx.msg = m end
        st.msg = m
    elseif tx ~= nil and ANSWERS[tx.req_type][h.msg_type] then
        if tx.response == nil then tx.response = pinfo.number end
        st.msg = tx.msg
    else
        tx = nil
    end
    st.tx = tx
    st.dir = st.msg and st.msg.dir
    return st
end

local function show_links(h, st, tree)
    local tx = st.tx
    if REQUEST[h.msg_type] then
        if tx and tx.response then tree:add(hf["response_in"], tx.response):set_generated() end
    elseif tx then
        tree:add(hf["request_in"], tx.request):set_generated()
        local d = st.ts - tx.req_ts
        local s = math.floor(d)
        tree:add(hf["time"], NSTime.new(s, math.floor((d - s) * 1e9 + 0.5))):set_generated()
    else
        tree:add_proto_expert_info(expert_no_request)
    end
end

local function add_element(tree, s, e, r, i, ent, st)
    if e.kind == "scalar" then
        tree:add_le(hf[s.item], r):prepend_text(string.format("[%d] ", i))
        return
    end
    local it = tree:add(hf[s.item], r)
    if e.kind == "values" then
        local n, esz = ent[e.count], DTYPE_SIZE[ent[e.dtype]]
        local read, shown = VALUE_READER[ent[e.dtype]], {}
        for j = 0, n - 1 do
            local vr = r(j * esz, esz)
            local v = read(vr)
            it:add(hf[s.item .. ".value"], vr, v)
            if j < 4 then shown[#shown + 1] = string.format("%.6g", v) end
        end
        if n > 4 then shown[#shown + 1] = "..." end
        it:set_text(string.format("%s [%d]: %s", s.item, i, table.concat(shown, ", ")))
    elseif e.kind == "bits" then
        local held, missing = {}, {}
        for bit = 0, e.bits - 1 do
            local byte = r(math.floor(bit / 8), 1)
            if math.floor(byte:uint() / 2 ^ (bit % 8)) % 2 == 1 then
                it:add(hf[s.item .. ".fragment"], byte, bit)
                held[#held + 1] = tostring(bit)
            elseif st.msg and bit < st.msg.frag_count then
                it:add(hf[s.item .. ".missing"], byte, bit):set_generated()
                missing[#missing + 1] = tostring(bit)
            end
        end
        local text = string.format("%s: %d", s.name, #held)
        if st.msg then
            text = text .. string.format(" (of the request's %d fragments, missing: %s)", st.msg.frag_count,
                                         #missing > 0 and table.concat(missing, ", ") or "none")
        end
        it:set_text(text .. ": " .. table.concat(held, ", "))
    else
        local shown = {}
        for _, f in ipairs(e.fields) do
            local fr = r(f.offset, f.size)
            it:add_le(hf[s.item .. "." .. f.name], fr)
            if f.name:sub(1, 8) ~= "reserved" then
                local v = fr:le_uint()
                shown[#shown + 1] = string.format("%s=%s", f.name, f.names and f.names[v] or tostring(v))
            end
        end
        it:set_text(string.format("%s [%d]: %s", s.item, i, table.concat(shown, " ")))
    end
end

-- the elements of a run (n of esz bytes from body offset g0) that body bytes [x, y) of this
-- fragment (body offset lo at tvb offset HDR_LEN) hold: whole ones decoded, cut ones as partial
local function add_run(tree, tvb, lo, s, e, g0, n, esz, x, y, ent, st)
    x, y = math.max(x, g0), math.min(y, g0 + n * esz)
    if x >= y or esz <= 0 then return end
    for i = math.floor((x - g0) / esz), math.floor((y - 1 - g0) / esz) do
        local e0 = g0 + i * esz
        local c0, c1 = math.max(e0, x), math.min(e0 + esz, y)
        local r = tvb(HDR_LEN + c0 - lo, c1 - c0)
        if c0 == e0 and c1 == e0 + esz then
            add_element(tree, s, e, r, i, ent, st)
        else
            tree:add(hf["partial"], r):set_text(string.format(
                "%s [%d]: bytes %d..%d of %d (the rest in another fragment)", s.item, i, c0 - e0, c1 - e0 - 1, esz))
        end
    end
end

-- this fragment's part of the body: body bytes [frag_offset, frag_offset + frag_len) of the
-- message, within the captured bytes (tvb offset HDR_LEN); `dir` the directory it is read with
local function dissect_body(tvb, tree, h, dir, st, why)
    local lo = h.frag_offset
    local hi = lo + math.min(h.frag_len, tvb:len() - HDR_LEN)
    local start = 0
    for _, s in ipairs(LAYOUT[h.msg_type]) do
        local e = ELEMENT[s.element]
        local stop = start + section_size(s, h)
        local a, b = math.max(start, lo), math.min(stop, hi)
        if a < b then
            local sub = tree:add(tvb(HDR_LEN + a - lo, b - a), string.format("%s: bytes %d..%d of %d", s.name,
                                                                             a - start, b - 1 - start, stop - start))
            if s.per_table and dir then
                local g0 = start
                for _, ent in ipairs(dir) do
                    local n, esz = ent[s.per_table], element_size(e, ent)
                    local g1 = g0 + n * esz
                    local x, y = math.max(g0, a), math.min(g1, b)
                    if x < y then
                        local t = sub:add(hf[s.item .. ".table"], tvb(HDR_LEN + x - lo, y - x), ent[DIRECTORY.table])
                        t:set_text(string.format("table %d: %s %d..%d of %d", ent[DIRECTORY.table], s.name,
                                                 math.floor((x - g0) / esz), math.floor((y - 1 - g0) / esz), n))
                        add_run(t, tvb, lo, s, e, g0, n, esz, x, y, ent, st)
                    end
                    g0 = g1
                end
            elseif e.kind == "values" then
                sub:add(hf["undecoded"], tvb(HDR_LEN + a - lo, b - a)):set_text(string.format(
                    "%s bytes %d..%d: tables unknown (%s)", s.name, a - start, b - 1 - start, why))
            else
                add_run(sub, tvb, lo, s, e, start, count_of(s, h), e.size, a, b, nil, st)
            end
        end
        start = stop
    end
end

local function summary(h)
    local out = { TYPE_NAMES[h.msg_type] or string.format("type %d", h.msg_type) }
    for _, f in ipairs(SUMMARY) do
        local v = h[f.field]
        if f.names == nil then
            out[#out + 1] = string.format("%s=%d", f.label, v)
        elseif v ~= 0 then
            local name = f.names[v]
            if f.bits then
                local set = {}
                for bit, n in pairs(f.names) do
                    if math.floor(v / bit) % 2 == 1 then set[#set + 1] = n end
                end
                table.sort(set)
                name = table.concat(set, ",")
            end
            out[#out + 1] = string.format("%s=%s", f.label, name or tostring(v))
        end
    end
    if h.frag_count ~= 1 then out[#out + 1] = string.format("frag=%d/%d", h.frag_index, h.frag_count) end
    return table.concat(out, " ")
end

local function drop(tree, item, pinfo, reason, detail, seg)
    tree:add(hf["drop_reason"], reason):set_generated()
    item:add_proto_expert_info(expert_of[reason], string.format("Malformed embnic frame (%s): %s", reason, detail))
    if seg then
        pinfo.cols.info:append(string.format(" [frame %d malformed: %s]", seg.index, reason))
    else
        pinfo.cols.info:append(string.format(" [malformed: %s]", reason))
    end
    tree:append_text(string.format(", malformed: %s", reason))
end

local function read_header(tvb, off)
    local h = {}
    for _, f in ipairs(HEADER) do h[f.name] = tvb(off + f.offset, f.size):uint() end
    return h
end

-- the header passes every check a receiver makes of a frame of HDR_LEN + body_len bytes
local function header_ok(h, body_len)
    for _, c in ipairs(CHECKS) do
        local v = h[c.field]
        if (c.expect ~= nil and v ~= c.expect) or (c.names ~= nil and c.names[v] == nil) then return false end
    end
    return check_geometry(h, body_len) == nil
end

-- A UDP GSO send (UDP_SEGMENT): a shard hands a reply's frames to its kernel as one datagram of
-- frames `seg` bytes each (the last may be shorter), which the kernel (or the NIC) cuts into
-- datagrams after a capture on the sending host or on loopback saw it whole: larger than the
-- MTU, its UDP payload frames laid back to back. Such a datagram is read as the frames it
-- becomes, each checked as a receiver checks it. It is one when its first frame is a valid
-- fragment (not the last) of HDR_LEN + frag_len bytes followed by a fragment of the same message
-- (consts.MESSAGE_FIELDS); anything else is one frame (bad_length if it is longer).
-- Returns the segment size, or nil.
local function gso_size(tvb, h, n)
    local seg = HDR_LEN + h.frag_len
    if n <= seg or tvb:len() < seg + HDR_LEN or h.frag_index + 1 >= h.frag_count or not header_ok(h, h.frag_len) then
        return nil
    end
    local h2 = read_header(tvb, seg)
    for _, k in ipairs(MESSAGE_FIELDS) do
        if h2[k] ~= h[k] then return nil end
    end
    if h2.magic ~= h.magic or h2.version ~= h.version then return nil end
    return seg
end

-- one embnic frame: tvb its captured bytes, n its length on the wire, key its first-pass state's,
-- seg nil or { index, count, size } for a frame of a GSO send
local function dissect_frame(tvb, n, pinfo, tree, key, seg)
    local t = tree:add(embnic, tvb())
    if seg then
        t:append_text(string.format(", GSO frame %d of %d", seg.index, seg.count))
        t:add(hf["gso_frame"], seg.index):set_generated()
        t:add(hf["gso_size"], seg.size):set_generated()
    end
    if n < HDR_LEN or tvb:len() < HDR_LEN then
        if not seg then pinfo.cols.info:set("embnic") end
        drop(t, t, pinfo, "too_short", string.format("%d bytes < %d", n, HDR_LEN), seg)
        return
    end
    local h, items = {}, {}
    for _, f in ipairs(HEADER) do
        local r = tvb(f.offset, f.size)
        h[f.name] = r:uint()
        items[f.name] = t:add(f.hf, r)
        if f.bits then for _, b in ipairs(f.bits) do items[f.name]:add(b, r) end end
    end
    if not seg then
        pinfo.cols.info:set(summary(h))
    elseif seg.index == 0 then
        pinfo.cols.info:set(string.format("UDP GSO send of %d frames of %d bytes: %s", seg.count, seg.size,
                                          summary(h)))
    end
    t:append_text(", " .. summary(h))
    for _, c in ipairs(CHECKS) do
        local v = h[c.field]
        if (c.expect ~= nil and v ~= c.expect) or (c.names ~= nil and c.names[v] == nil) then
            drop(t, items[c.field], pinfo, c.reason, string.format("%s %d", c.field, v), seg)
            return
        end
    end
    local reason, detail, field = check_geometry(h, n - HDR_LEN)
    if reason then
        drop(t, items[field], pinfo, reason, detail, seg)
        return
    end
    local st = frame_state[key]
    if st == nil or not pinfo.visited then
        st = first_pass(tvb, h, pinfo)
        st.ts = pinfo.abs_ts
        frame_state[key] = st
    end
    show_links(h, st, t)
    local dir, why = st.dir, "no complete directory seen before this frame"
    local has_tables = false
    for _, s in ipairs(LAYOUT[h.msg_type]) do has_tables = has_tables or s.per_table ~= nil end
    if dir and has_tables then
        local fault = directory_fault(dir, h)
        if fault then
            local whose = REQUEST[h.msg_type] and "Directory does not add up (a host answers MALFORMED)"
                          or "The request's directory does not fit this reply"
            t:add_proto_expert_info(expert_bad_directory, string.format("%s: %s", whose, fault))
            dir, why = nil, "the directory does not add up"
        else
            t:add(hf["directory_in"], dir.frame):set_generated()
        end
    end
    dissect_body(tvb, t, h, dir, st, why)
end

function embnic.dissector(tvb, pinfo, tree)
    pinfo.cols.protocol:set("embnic")
    local n = tvb:reported_len()
    local size = nil
    if n >= HDR_LEN and tvb:len() >= HDR_LEN then size = gso_size(tvb, read_header(tvb, 0), n) end
    if size == nil then
        dissect_frame(tvb, n, pinfo, tree, pinfo.number, nil)
        return tvb:len()
    end
    local count = math.ceil(n / size)
    for i = 0, count - 1 do
        local off = i * size
        local have = math.min(size, n - off, tvb:len() - off)
        if have <= 0 then break end  -- the rest was not captured
        dissect_frame(tvb(off, have):tvb(), math.min(size, n - off), pinfo, tree,
                      string.format("%d.%d", pinfo.number, i), { index = i, count = count, size = size })
    end
    return tvb:len()
end

local udp_port = DissectorTable.get("udp.port")
udp_port:add(UDP_PORT, embnic)
udp_port:add_for_decode_as(embnic)
