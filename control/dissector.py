"""The Wireshark dissector of the embnic protocol, generated from the one field table.

:func:`generate_lua` writes a Wireshark Lua plug-in (``embnic dissector --out embnic.lua``;
the shipped copy is ``contrib/wireshark/embnic.lua``, which a test regenerates and compares).
Nothing in it is written per field: every header field's offset and size comes from
:data:`consts.HEADER_FIELDS`, its name, meaning, value names and validity check from
:data:`consts.FIELD_DOCS`, the body from :data:`consts.BODY_LAYOUT` and
:data:`consts.BODY_ELEMENTS`, the request/reply pairs from :data:`consts.ANSWERS`; the Lua code
around those tables interprets them.

What the plug-in does (Wireshark 3.4+, Lua 5.2+; checked with tshark 4.0 by
``tests/control/test_dissector.py``):

- names every header field with its meaning (message types, dtypes, status codes and flag bits
  by name); the Info column is a one-line summary (:attr:`consts.FieldDoc.summary`);
- checks a frame as every receiver does (docs/protocol.md "Validity", in
  :func:`embnic.client_lib.codec.parse_header`'s order) and flags the first failure as an
  expert-info error (group Malformed) named by its drop reason (``embnic.expert.bad_length``,
  field ``embnic.drop_reason``) instead of failing; it never reads past the captured bytes;
- shows this fragment's part of the body as the header says: keys, rows, gradients, SIZE_REQ
  entries, each element with its index in the message; an element cut by a fragment boundary
  shows as ``embnic.partial``;
- tracks requests and replies by (client id, message id) (:data:`consts.TRANSACTION_KEY`, the
  card's state-map key: the card rewrites addresses, so the UDP conversation is not the key):
  ``embnic.response_in`` on a request's frames, ``embnic.request_in`` and ``embnic.time`` on a
  reply's (run tshark with ``-2`` to see a request's link to its later reply);
- registers on UDP port 7878 and for "Decode As" (``tshark -d udp.port==PORT,embnic``).

Layout of the generated file: header, value-name tables, header fields (:func:`_header_lua`),
body (:func:`_body_lua`, the only part that knows the body layout), then the fixed dissector
code (:data:`_DISSECTOR_LUA`).
"""
from __future__ import annotations

import enum

from pathlib import Path

import numpy as np

from embnic.client_lib import consts
from embnic.control.errors import OperationalError, UsageError

#: where the shipped plug-in lives in the repository
SHIPPED_PATH = "contrib/wireshark/embnic.lua"

_UINT = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def lua_str(s: str) -> str:
    """``s`` as a Lua double-quoted string literal."""
    out = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{out}"'


def _bits(flags: type[enum.IntFlag]) -> list[enum.IntFlag]:
    """The single-bit members of an IntFlag (not ``NONE``, not combinations)."""
    return [m for m in flags.__members__.values() if int(m) and not int(m) & (int(m) - 1)]


def _names_table(values: type[enum.Enum]) -> str:
    """Lua table ``{[1] = "LOOKUP_REQ", ...}`` of an IntEnum's members (an IntFlag: its named bits)."""
    members = _bits(values) if issubclass(values, enum.IntFlag) else list(values.__members__.values())
    return "{ " + ", ".join(f"[{int(m)}] = {lua_str(m.name)}" for m in members) + " }"


def _uint_field(abbrev: str, title: str, size: int, *, hex_: bool = False, values: str = "nil",
                desc: str | None = None) -> str:
    if size not in _UINT:
        raise ValueError(f"{abbrev}: no Wireshark unsigned field of {size} bytes")
    base = "base.HEX" if hex_ else "base.DEC"
    return (f"ProtoField.{_UINT[size]}({lua_str(abbrev)}, {lua_str(title)}, {base}, {values}, nil"
            + (f", {lua_str(desc)})" if desc else ")"))


def _value_tables() -> tuple[str, dict[type, str]]:
    """Lua tables of value names, one per enum some field names (``vs_MsgType``, ...)."""
    enums: dict[type, str] = {}
    for doc in consts.FIELD_DOCS.values():
        if doc.values is not None and doc.values not in enums:
            enums[doc.values] = f"vs_{doc.values.__name__}"
    lines = [f"local {name} = {_names_table(e)}" for e, name in enums.items()]
    return "\n".join(lines), enums


def _check_field_docs() -> None:
    names = [n for n, _, _ in consts.HEADER_FIELDS]
    if list(consts.FIELD_DOCS) != names:
        raise ValueError(f"consts.FIELD_DOCS names {list(consts.FIELD_DOCS)} but HEADER_FIELDS has {names}")
    for n, d in consts.FIELD_DOCS.items():
        if d.drop_reason is not None and d.drop_reason not in consts.DROP_REASONS:
            raise ValueError(f"FIELD_DOCS[{n!r}].drop_reason {d.drop_reason!r} is not in DROP_REASONS")


def _header_lua(enums: dict[type, str]) -> str:
    """Header fields, the HEADER table (name, offset, size, field, flag bits), the validity checks
    and the summary labels: all from HEADER_FIELDS and FIELD_DOCS."""
    _check_field_docs()
    out = ["-- ---- header fields: consts.HEADER_FIELDS (offset, size) and FIELD_DOCS (meaning, names) ----"]
    rows = []
    for name, off, size in consts.HEADER_FIELDS:
        d = consts.FIELD_DOCS[name]
        vs = enums[d.values] if d.values is not None and not issubclass(d.values, enum.IntFlag) else "nil"
        out.append(f"hf[{lua_str(name)}] = " + _uint_field(f"embnic.{name}", d.title, size, hex_=d.hex,
                                                          values=vs, desc=d.meaning))
        bits = []
        if d.values is not None and issubclass(d.values, enum.IntFlag):
            for m in _bits(d.values):
                key = f"{name}.{m.name.lower()}"
                out.append(f"hf[{lua_str(key)}] = ProtoField.bool({lua_str('embnic.' + key)}, "
                           f"{lua_str(m.name)}, {8 * size}, nil, 0x{int(m):x})")
                bits.append(f"hf[{lua_str(key)}]")
        row = f"  {{ name = {lua_str(name)}, offset = {off}, size = {size}, hf = hf[{lua_str(name)}]"
        if bits:
            row += ", bits = { " + ", ".join(bits) + " }"
        rows.append(row + " },")
    out.append("local HEADER = {\n" + "\n".join(rows) + "\n}")
    checks = []
    for name, d in consts.FIELD_DOCS.items():
        if d.drop_reason is None:
            continue
        if d.expect is not None:
            want = f"0x{d.expect:X}" if d.hex else str(d.expect)
            checks.append(f"  {{ field = {lua_str(name)}, expect = {want}, reason = {lua_str(d.drop_reason)} }},")
        elif d.values is not None:
            checks.append(f"  {{ field = {lua_str(name)}, names = {enums[d.values]}, "
                          f"reason = {lua_str(d.drop_reason)} }},")
        else:
            raise ValueError(f"FIELD_DOCS[{name!r}] has a drop_reason but neither expect nor values")
    out.append("-- the checks of FIELD_DOCS (expect / values), in field order\nlocal CHECKS = {\n"
               + "\n".join(checks) + "\n}")
    summary = []
    for name, d in consts.FIELD_DOCS.items():
        if d.summary is None:
            continue
        names = "nil"
        if d.values is not None:
            names = enums[d.values] + (", bits = true" if issubclass(d.values, enum.IntFlag) else "")
        summary.append(f"  {{ field = {lua_str(name)}, label = {lua_str(d.summary)}, names = {names} }},")
    out.append("-- one-line summary (Info column): FieldDoc.summary\nlocal SUMMARY = {\n"
               + "\n".join(summary) + "\n}")
    key = ", ".join(lua_str(k) for k in consts.TRANSACTION_KEY)
    out.append(f"-- consts.TRANSACTION_KEY: a reply answers the request with these fields equal\n"
               f"local TRANSACTION_KEY = {{ {key} }}")
    requests = ", ".join(f"[{int(t)}] = true" for t in sorted(consts.REQUEST_TYPES))
    answers = ", ".join(f"[{int(q)}] = {{ " + ", ".join(f"[{int(r)}] = true" for r in sorted(rs)) + " }"
                        for q, rs in sorted(consts.ANSWERS.items()))
    out.append(f"local TYPE_NAMES = {enums[consts.FIELD_DOCS['msg_type'].values]}")
    out.append(f"local REQUEST = {{ {requests} }}\n-- consts.ANSWERS: request type -> reply types\n"
               f"local ANSWERS = {{ {answers} }}")
    return "\n".join(out)


def _numpy_field(abbrev: str, title: str, np_type: str, values: str = "nil") -> tuple[str, int]:
    """(ProtoField constructor, size) of a little-endian numpy scalar type in a body."""
    dt = np.dtype(np_type)
    if dt.kind == "u":
        return _uint_field(abbrev, title, dt.itemsize, values=values), dt.itemsize
    raise ValueError(f"{abbrev}: body scalar {np_type!r} is not an unsigned integer")


def _body_lua(enums: dict[type, str]) -> str:
    """The body: element fields and the LAYOUT / ELEMENT tables, from BODY_LAYOUT, BODY_ELEMENTS,
    DTYPE_SIZE and DTYPE_NUMPY. The one place that knows what a body holds."""
    out = ["-- ---- body: consts.BODY_LAYOUT (sections per type), BODY_ELEMENTS, DTYPE_SIZE ----"]
    dsize = ", ".join(f"[{int(d)}] = {s}" for d, s in consts.DTYPE_SIZE.items())
    readers = []
    for d, np_type in consts.DTYPE_NUMPY.items():
        dt = np.dtype(np_type)
        if dt.kind != "f" or dt.itemsize not in (2, 4, 8):
            raise ValueError(f"DTYPE_NUMPY[{d!r}] = {np_type!r}: the dissector reads fp16, fp32, fp64 values")
        readers.append(f"[{int(d)}] = {lua_str('half' if dt.itemsize == 2 else 'float')}")
    out.append(f"local DTYPE_SIZE = {{ {dsize} }}\n-- how a value of each dtype is read (consts.DTYPE_NUMPY)\n"
               f"local VALUE_READER = {{ {', '.join(readers)} }}")
    elements = []
    for kind, e in consts.BODY_ELEMENTS.items():
        if e.numpy is not None:
            elements.append(f"  {kind} = {{ kind = \"scalar\", size = {np.dtype(e.numpy).itemsize} }},")
        elif e.values_of is not None:
            count, dtype = e.values_of
            elements.append(f"  {kind} = {{ kind = \"values\", count = {lua_str(count)}, dtype = {lua_str(dtype)} }},")
        elif e.fields:
            dt = np.dtype(list(e.fields))
            sub = ", ".join(f"{{ name = {lua_str(n)}, offset = {dt.fields[n][1]}, size = {dt.fields[n][0].itemsize} }}"
                            for n, _ in e.fields)
            elements.append(f"  {kind} = {{ kind = \"struct\", size = {dt.itemsize}, fields = {{ {sub} }} }},")
        else:
            raise ValueError(f"BODY_ELEMENTS[{kind!r}] says neither numpy, values_of nor fields")
    out.append("local ELEMENT = {\n" + "\n".join(elements) + "\n}")
    items: dict[str, str] = {}
    for t, sections in consts.BODY_LAYOUT.items():
        for s in sections:
            if s.element not in consts.BODY_ELEMENTS:
                raise ValueError(f"BODY_LAYOUT[{t.name}]: unknown element {s.element!r}")
            if s.count not in consts.FIELD_DOCS:
                raise ValueError(f"BODY_LAYOUT[{t.name}]: count {s.count!r} is not a header field")
            if items.setdefault(s.item, s.element) != s.element:
                raise ValueError(f"BODY_LAYOUT: item {s.item!r} names two element kinds")
    for item, kind in items.items():
        e = consts.BODY_ELEMENTS[kind]
        if e.numpy is not None:
            ctor, _ = _numpy_field(f"embnic.{item}", item.capitalize(), e.numpy)
            out.append(f"hf[{lua_str(item)}] = {ctor}")
        else:
            out.append(f"hf[{lua_str(item)}] = ProtoField.bytes({lua_str('embnic.' + item)}, "
                       f"{lua_str(item.capitalize())})")
        if e.values_of is not None:
            out.append(f"hf[{lua_str(item + '.value')}] = ProtoField.double({lua_str(f'embnic.{item}.value')}, "
                       f"\"Value\")")
        for fname, np_type in e.fields:
            doc = consts.FIELD_DOCS.get(fname)
            vs = "nil"
            if doc is not None and doc.values is not None and not issubclass(doc.values, enum.IntFlag):
                vs = enums[doc.values]
            ctor, _ = _numpy_field(f"embnic.{item}.{fname}", doc.title if doc else fname, np_type, vs)
            out.append(f"hf[{lua_str(item + '.' + fname)}] = {ctor}")
    layout = []
    for t, sections in consts.BODY_LAYOUT.items():
        secs = ", ".join(f"{{ name = {lua_str(s.name)}, item = {lua_str(s.item)}, element = {lua_str(s.element)}, "
                         f"count = {lua_str(s.count)} }}" for s in sections)
        layout.append(f"  [{int(t)}] = {{ {secs} }},  -- {t.name}" if secs else f"  [{int(t)}] = {{}},  -- {t.name}")
    out.append("local LAYOUT = {\n" + "\n".join(layout) + "\n}")
    return "\n".join(out)


def generate_lua() -> str:
    """The Wireshark Lua plug-in for the protocol of :mod:`embnic.client_lib.consts`.

    Returns:
        the Lua source (str), deterministic: the same consts give the same bytes.
    Raises:
        ValueError: the field table and its docs disagree (a field without a FieldDoc, a body
            section whose count is not a header field, an element kind without a layout, ...).
    """
    vs, enums = _value_tables()
    drop = "\n".join(
        f"expert_of[{lua_str(r)}] = ProtoExpert.new({lua_str('embnic.expert.' + r)}, "
        f"{lua_str('Malformed embnic frame: ' + r)}, expert.group.MALFORMED, expert.severity.ERROR)"
        for r in consts.DROP_REASONS)
    head = _HEAD_LUA.format(version=consts.VERSION, port=consts.UDP_PORT, shipped=SHIPPED_PATH)
    consts_lua = (f"local VERSION = {consts.VERSION}\nlocal UDP_PORT = {consts.UDP_PORT}\n"
                  f"local HDR_LEN = {consts.HDR_LEN}\nlocal MAX_FRAGS = {consts.MAX_FRAGS}")
    parts = [head, consts_lua, "-- ---- value names: consts enums ----\n" + vs,
             "local hf = {}", _header_lua(enums), _body_lua(enums),
             "-- ---- expert info: one error per drop reason (consts.DROP_REASONS) ----\nlocal expert_of = {}\n" + drop,
             _DISSECTOR_LUA]
    return "\n\n".join(parts).rstrip() + "\n"


_HEAD_LUA = """\
-- embnic.lua: Wireshark dissector for the embnic wire protocol, version {version} (docs/protocol.md).
--
-- GENERATED by `embnic dissector` (embnic.control.dissector) from client_lib/consts.py:
-- do not edit; regenerate with `embnic dissector --out {shipped}`.
--
-- Install (Wireshark 3.4 or later): copy this file to your personal Lua plug-ins folder,
--     mkdir -p ~/.local/lib/wireshark/plugins && cp embnic.lua ~/.local/lib/wireshark/plugins/
-- (Help > About Wireshark > Folders shows it), or load it for one run:
--     tshark -X lua_script:embnic.lua -2 -r capture.pcap -Y embnic
-- Registered on UDP port {port}; on any other port: Analyze > Decode As... (UDP port, EMBNIC),
-- or tshark -d udp.port==PORT,embnic.

local embnic = Proto("embnic", "embnic embedding parameter-server protocol")"""

_DISSECTOR_LUA = r"""-- ---- request/response tracking, drop reason, body parts ----
hf["request_in"] = ProtoField.framenum("embnic.request_in", "Request in", base.NONE, frametype.REQUEST)
hf["response_in"] = ProtoField.framenum("embnic.response_in", "Response in", base.NONE, frametype.RESPONSE)
hf["time"] = ProtoField.relative_time("embnic.time", "Time since request")
hf["drop_reason"] = ProtoField.string("embnic.drop_reason", "Drop reason")
hf["partial"] = ProtoField.bytes("embnic.partial", "Part of an element cut by a fragment boundary")
local expert_no_request = ProtoExpert.new("embnic.expert.no_request", "Reply to no request in this capture",
                                          expert.group.SEQUENCE, expert.severity.NOTE)

local fields, experts = {}, { expert_no_request }
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

local function element_size(e, h)
    if e.kind == "values" then return h[e.count] * DTYPE_SIZE[h[e.dtype]] end
    return e.size
end

-- body bytes a message of this header must have: its sections back to back
local function body_size(h)
    local n = 0
    for _, s in ipairs(LAYOUT[h.msg_type]) do n = n + h[s.count] * element_size(ELEMENT[s.element], h) end
    return n
end

-- docs/protocol.md "Validity" past the single-field checks, in codec.parse_header's order:
-- returns reason, detail, the field to flag; nil when the frame adds up
local function check_geometry(h, body_len)
    for _, s in ipairs(LAYOUT[h.msg_type]) do
        local e = ELEMENT[s.element]
        if e.kind == "values" and DTYPE_SIZE[h[e.dtype]] == 0 then
            return "bad_dtype", string.format("%s %d carries no %s values", e.dtype, h[e.dtype], s.name), e.dtype
        end
    end
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
    for _, s in ipairs(LAYOUT[h.msg_type]) do
        if h[s.count] == 0 then return "bad_length", s.count .. " 0", s.count end
    end
    if h.frag_count > MAX_FRAGS then
        return "too_many_frags", string.format("frag_count %d > %d", h.frag_count, MAX_FRAGS), "frag_count"
    end
    return nil
end

local function add_element(tree, s, e, r, i, h)
    if e.kind == "scalar" then
        tree:add_le(hf[s.item], r):prepend_text(string.format("[%d] ", i))
        return
    end
    local it = tree:add(hf[s.item], r)
    if e.kind == "values" then
        local read, esz, shown = VALUE_READER[h[e.dtype]], DTYPE_SIZE[h[e.dtype]], {}
        for j = 0, h[e.count] - 1 do
            local vr = r(j * esz, esz)
            local v = read(vr)
            it:add(hf[s.item .. ".value"], vr, v)
            if j < 4 then shown[#shown + 1] = string.format("%.6g", v) end
        end
        if h[e.count] > 4 then shown[#shown + 1] = "..." end
        it:set_text(string.format("%s [%d]: %s", s.item, i, table.concat(shown, ", ")))
    else
        for _, f in ipairs(e.fields) do it:add_le(hf[s.item .. "." .. f.name], r(f.offset, f.size)) end
        it:set_text(string.format("%s [%d]", s.item, i))
    end
end

-- this fragment's part of the body: body bytes [frag_offset, frag_offset + frag_len) of the
-- message, within the captured bytes (tvb offset HDR_LEN)
local function dissect_body(tvb, tree, h)
    local lo = h.frag_offset
    local hi = lo + math.min(h.frag_len, tvb:len() - HDR_LEN)
    local start = 0
    for _, s in ipairs(LAYOUT[h.msg_type]) do
        local e = ELEMENT[s.element]
        local esz, n = element_size(e, h), h[s.count]
        local stop = start + n * esz
        local a, b = math.max(start, lo), math.min(stop, hi)
        if a < b and esz > 0 then
            local first, last = math.floor((a - start) / esz), math.floor((b - 1 - start) / esz)
            local sub = tree:add(tvb(HDR_LEN + a - lo, b - a),
                                 string.format("%s %d..%d of %d", s.name, first, last, n))
            for i = first, last do
                local e0 = start + i * esz
                local c0, c1 = math.max(e0, a), math.min(e0 + esz, b)
                local r = tvb(HDR_LEN + c0 - lo, c1 - c0)
                if c0 == e0 and c1 == e0 + esz then
                    add_element(sub, s, e, r, i, h)
                else
                    sub:add(hf["partial"], r):set_text(string.format(
                        "%s [%d]: bytes %d..%d of %d (the rest in another fragment)", s.item, i, c0 - e0,
                        c1 - e0 - 1, esz))
                end
            end
        end
        start = stop
    end
end

local tx_by_key, tx_by_frame = {}, {}
function embnic.init()
    tx_by_key, tx_by_frame = {}, {}
end

-- a transaction: a request message's frames and its reply's, matched by TRANSACTION_KEY and
-- ANSWERS on the first pass; a request after the reply began starts a new one (a retransmission)
local function track(h, pinfo, tree)
    if not pinfo.visited then
        local parts = {}
        for _, k in ipairs(TRANSACTION_KEY) do parts[#parts + 1] = tostring(h[k]) end
        local key = table.concat(parts, ":")
        local tx = tx_by_key[key]
        if REQUEST[h.msg_type] then
            if tx == nil or tx.response ~= nil or tx.req_type ~= h.msg_type then
                tx = { request = pinfo.number, req_type = h.msg_type, req_ts = pinfo.abs_ts }
                tx_by_key[key] = tx
            end
        elseif tx ~= nil and ANSWERS[tx.req_type][h.msg_type] then
            if tx.response == nil then tx.response = pinfo.number end
        else
            tx = nil
        end
        tx_by_frame[pinfo.number] = tx or false
    end
    local tx = tx_by_frame[pinfo.number]
    if REQUEST[h.msg_type] then
        if tx and tx.response then tree:add(hf["response_in"], tx.response):set_generated() end
    elseif tx then
        tree:add(hf["request_in"], tx.request):set_generated()
        local d = pinfo.abs_ts - tx.req_ts
        local s = math.floor(d)
        tree:add(hf["time"], NSTime.new(s, math.floor((d - s) * 1e9 + 0.5))):set_generated()
    else
        tree:add_proto_expert_info(expert_no_request)
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

local function drop(tree, item, pinfo, reason, detail)
    tree:add(hf["drop_reason"], reason):set_generated()
    item:add_proto_expert_info(expert_of[reason], string.format("Malformed embnic frame (%s): %s", reason, detail))
    pinfo.cols.info:append(string.format(" [malformed: %s]", reason))
    tree:append_text(string.format(", malformed: %s", reason))
end

function embnic.dissector(tvb, pinfo, tree)
    pinfo.cols.protocol:set("embnic")
    local t = tree:add(embnic, tvb())
    local n = tvb:reported_len()
    if n < HDR_LEN or tvb:len() < HDR_LEN then
        pinfo.cols.info:set("embnic")
        drop(t, t, pinfo, "too_short", string.format("%d bytes < %d", n, HDR_LEN))
        return tvb:len()
    end
    local h, items = {}, {}
    for _, f in ipairs(HEADER) do
        local r = tvb(f.offset, f.size)
        h[f.name] = r:uint()
        items[f.name] = t:add(f.hf, r)
        if f.bits then for _, b in ipairs(f.bits) do items[f.name]:add(b, r) end end
    end
    pinfo.cols.info:set(summary(h))
    t:append_text(", " .. summary(h))
    for _, c in ipairs(CHECKS) do
        local v = h[c.field]
        if (c.expect ~= nil and v ~= c.expect) or (c.names ~= nil and c.names[v] == nil) then
            drop(t, items[c.field], pinfo, c.reason, string.format("%s %d", c.field, v))
            return tvb:len()
        end
    end
    local reason, detail, field = check_geometry(h, n - HDR_LEN)
    if reason then
        drop(t, items[field], pinfo, reason, detail)
        return tvb:len()
    end
    track(h, pinfo, t)
    dissect_body(tvb, t, h)
    return tvb:len()
end

local udp_port = DissectorTable.get("udp.port")
udp_port:add(UDP_PORT, embnic)
udp_port:add_for_decode_as(embnic)"""


def write_lua(path: str) -> int:
    """Write :func:`generate_lua`'s plug-in to ``path`` (``"-"``: return it unwritten).

    Returns:
        bytes written.
    Raises:
        UsageError: the folder of ``path`` does not exist, or ``path`` is a folder.
        OperationalError: the file cannot be written (permissions, disk full).
    """
    text = generate_lua()
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"--out {path} is a folder: give a file name, e.g. {p / 'embnic.lua'}", param="out")
    if not p.parent.is_dir():
        raise UsageError(f"--out {path}: folder {p.parent} does not exist; create it first", param="out")
    try:
        p.write_text(text)
    except OSError as e:
        raise OperationalError(f"cannot write {path}: {e.strerror}") from None
    return len(text.encode())
