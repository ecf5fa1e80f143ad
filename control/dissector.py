"""The Wireshark dissector of the embnic protocol, generated from the one field table.

:func:`generate_lua` writes a Wireshark Lua plug-in (``embnic dissector --out embnic.lua``;
the shipped copy is ``contrib/wireshark/embnic.lua``, which a test regenerates and compares).
Nothing in it is written per field: every header field's offset and size comes from
:data:`consts.HEADER_FIELDS`, its name, meaning, value names and validity check from
:data:`consts.FIELD_DOCS`, the header's count rules from :data:`consts.HEADER_COUNT_RULES`,
the body from :data:`consts.BODY_LAYOUT` and :data:`consts.BODY_ELEMENTS`, the request/reply
pairs from :data:`consts.ANSWERS`; the Lua code around those tables interprets them.

What the plug-in does (Wireshark 3.4+, Lua 5.2+; checked with tshark 4.0 by
``tests/control/test_dissector.py``):

- names every header field with its meaning (message types, status codes and flag bits by
  name); the Info column is a one-line summary (:attr:`consts.FieldDoc.summary`);
- checks a frame as every receiver does from its header alone (docs/protocol.md "Validity", in
  the card's order, ``embnic_parse`` → ``embnic_check_lengths`` of
  ``dataplane/include/embnic_parse.h``: magic, version — a v1 frame is ``bad_version`` —, type,
  the fragment's fit in its frame and message, ``msg_len`` by ``expected_msg_len``, the counts by
  ``header_counts_ok``, ``too_many_frags``, then the offset and length against the index,
  ``frag_mismatch``, as the client's ``reassembly.fragment_size``) and flags the first failure as
  an expert-info error (group Malformed) named by the card's drop reason
  (``embnic.expert.bad_length``, field ``embnic.drop_reason``) instead of failing; it never reads
  past the captured bytes; a request whose directory does not add up to its header — a table
  twice, an entry without keys, dim or dtype, its keys or its rows' bytes not the header's
  ``num_keys`` / ``value_len``, a LOOKUP_REQ's as an UPDATE_REQ's: what a shard answers
  ``MALFORMED`` (``codec.parse_request_body``) — is a warning (``embnic.expert.bad_directory``);
- reads a UDP GSO send (a shard's reply handed to its kernel as one datagram of back-to-back
  frames, larger than the MTU, as a capture on its host or on loopback sees it) as the frames it
  becomes (``embnic.gso_frame``, ``embnic.gso_size``), each checked on its own;
- shows this fragment's part of the body (:data:`_HEAD_LUA` says what per fragment): directory
  entries (table, dim, dtype by name, keys), keys grouped per table, an update's gradients and a
  lookup reply's rows per table as values of the table's dtype (a reply by its request's
  directory), SIZE_REQ entries, an UPDATE_NACK's fragments held (and, its update seen, the
  ones missing); an element cut by a fragment boundary shows as ``embnic.partial``;
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
    docs = list(consts.FIELD_DOCS.values()) + [d for e in consts.BODY_ELEMENTS.values() for d in e.docs.values()]
    for doc in docs:
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
    rules = []
    for t, rs in sorted(consts.HEADER_COUNT_RULES.items()):
        for field, op, k, other in rs:
            for f in (field, other):
                if f is not None and f not in consts.FIELD_DOCS:
                    raise ValueError(f"HEADER_COUNT_RULES[{t.name}]: {f!r} is not a header field")
            if op not in (">=", "=="):
                raise ValueError(f"HEADER_COUNT_RULES[{t.name}]: operator {op!r} is not >= or ==")
        rows = ", ".join(f"{{ field = {lua_str(f)}, op = {lua_str(op)}, k = {int(k)}"
                         + (f", other = {lua_str(o)}" if o else "") + " }" for f, op, k, o in rs)
        rules.append(f"  [{int(t)}] = {{ {rows} }},  -- {t.name}")
    out.append("-- consts.HEADER_COUNT_RULES (header_counts_ok): h[field] op k * h[other] (no other: op k)\n"
               "local COUNT_RULES = {\n" + "\n".join(rules) + "\n}")
    fields = ", ".join(lua_str(k) for k in consts.MESSAGE_FIELDS)
    out.append(f"-- consts.MESSAGE_FIELDS: equal in every fragment of one message\n"
               f"local MESSAGE_FIELDS = {{ {fields} }}")
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


def _numpy_field(abbrev: str, title: str, np_type: str, values: str = "nil", *, hex_: bool = False,
                 desc: str | None = None) -> tuple[str, int]:
    """(ProtoField constructor, size) of a little-endian numpy scalar type in a body."""
    dt = np.dtype(np_type)
    if dt.kind == "u":
        return _uint_field(abbrev, title, dt.itemsize, values=values, hex_=hex_, desc=desc), dt.itemsize
    raise ValueError(f"{abbrev}: body scalar {np_type!r} is not an unsigned integer")


def _directory() -> tuple[str, consts.BodyElement]:
    """The element kind of a request's directory (the one with ``table_of``) and the element."""
    kinds = [k for k, e in consts.BODY_ELEMENTS.items() if e.table_of is not None]
    if len(kinds) != 1:
        raise ValueError(f"BODY_ELEMENTS: {len(kinds)} elements name a table (table_of); the directory is one")
    return kinds[0], consts.BODY_ELEMENTS[kinds[0]]


def _check_layout() -> dict[str, str]:
    """Check BODY_LAYOUT against BODY_ELEMENTS and the header fields; returns item -> element kind."""
    dir_kind, dir_e = _directory()
    dir_fields = {n for n, _ in dir_e.fields}
    items: dict[str, str] = {}
    for t, sections in consts.BODY_LAYOUT.items():
        for s in sections:
            e = consts.BODY_ELEMENTS.get(s.element)
            if e is None:
                raise ValueError(f"BODY_LAYOUT[{t.name}]: unknown element {s.element!r}")
            if (s.count is None) == (s.nbytes is None):
                raise ValueError(f"BODY_LAYOUT[{t.name}] {s.name}: give count or nbytes, not both or neither")
            if (s.nbytes is not None) != (e.values_of is not None):
                raise ValueError(f"BODY_LAYOUT[{t.name}] {s.name}: rows (and only rows) are sized by nbytes")
            for f in (s.count, s.nbytes):
                if isinstance(f, str) and f not in consts.FIELD_DOCS:
                    raise ValueError(f"BODY_LAYOUT[{t.name}] {s.name}: {f!r} is not a header field")
            if s.per_table is not None and s.per_table not in dir_fields:
                raise ValueError(f"BODY_LAYOUT[{t.name}] {s.name}: per_table {s.per_table!r} is not a field of "
                                 f"{dir_kind}")
            if not s.item.isidentifier():
                raise ValueError(f"BODY_LAYOUT[{t.name}]: item {s.item!r} is not a field name")
            if items.setdefault(s.item, s.element) != s.element:
                raise ValueError(f"BODY_LAYOUT: item {s.item!r} names two element kinds")
    for kind, e in consts.BODY_ELEMENTS.items():
        if e.values_of is not None and not set(e.values_of) <= dir_fields:
            raise ValueError(f"BODY_ELEMENTS[{kind!r}].values_of {e.values_of} are not fields of {dir_kind}")
    return items


def _directory_lua() -> str:
    """The DIRECTORY table: which element is the directory and which of its fields and header
    fields tie it to a message (from BODY_ELEMENTS and BODY_LAYOUT)."""
    dir_kind, dir_e = _directory()
    counts = {s.count for ss in consts.BODY_LAYOUT.values() for s in ss if s.element == dir_kind}
    per_table = {s.per_table for ss in consts.BODY_LAYOUT.values() for s in ss if s.per_table}
    totals = {s.count for ss in consts.BODY_LAYOUT.values() for s in ss if s.per_table and s.count}
    rows = {consts.BODY_ELEMENTS[s.element].values_of for ss in consts.BODY_LAYOUT.values() for s in ss
            if s.per_table and consts.BODY_ELEMENTS[s.element].values_of}
    # the header field that sizes every section of rows (a lookup reply's, an update's gradients):
    # a directory's rows add up to it in every message that has one (a LOOKUP_REQ announces its
    # reply's rows by it), as a host checks (codec.parse_request_body)
    row_bytes = {s.nbytes for ss in consts.BODY_LAYOUT.values() for s in ss
                 if s.per_table and consts.BODY_ELEMENTS[s.element].values_of}
    for what, got in (("directory count", counts), ("per_table", per_table), ("per-table total", totals),
                      ("values_of", rows), ("row bytes", row_bytes)):
        if len(got) != 1:
            raise ValueError(f"BODY_LAYOUT: the {what} of the directory is not one field: {got}")
    (count,), (pt,), (total,), ((dim, dtype),), (rb,) = counts, per_table, totals, rows, row_bytes
    return ("-- the request's directory (consts.BODY_ELEMENTS[element].table_of): its entries count the\n"
            "-- header's `count`, their `per_table` add up to the header's `total`, a row of a table is\n"
            "-- entry[dim] values of entry[dtype], and its rows (entry[per_table] each) add up to the\n"
            "-- header's `rows` bytes (BODY_LAYOUT's nbytes of rows), in requests and replies alike\n"
            f"local DIRECTORY = {{ element = {lua_str(dir_kind)}, table = {lua_str(dir_e.table_of)}, "
            f"count = {lua_str(count)}, per_table = {lua_str(pt)}, total = {lua_str(total)}, dim = {lua_str(dim)}, "
            f"dtype = {lua_str(dtype)}, rows = {lua_str(rb)} }}")


def _body_lua(enums: dict[type, str]) -> str:
    """The body: element fields and the LAYOUT / ELEMENT / DIRECTORY tables, from BODY_LAYOUT,
    BODY_ELEMENTS, DTYPE_SIZE and DTYPE_NUMPY. The one place that knows what a body holds."""
    items = _check_layout()
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
            subs = []
            for n, _ in e.fields:
                doc = e.docs.get(n) or consts.FIELD_DOCS.get(n)
                names = ""
                if doc is not None and doc.values is not None and doc.values in enums:
                    names = f", names = {enums[doc.values]}"
                subs.append(f"{{ name = {lua_str(n)}, offset = {dt.fields[n][1]}, size = {dt.fields[n][0].itemsize}"
                            f"{names} }}")
            sub = ", ".join(subs)
            elements.append(f"  {kind} = {{ kind = \"struct\", size = {dt.itemsize}, fields = {{ {sub} }} }},")
        elif e.bits:
            if e.bits % 8:
                raise ValueError(f"BODY_ELEMENTS[{kind!r}].bits {e.bits} is not whole bytes")
            elements.append(f"  {kind} = {{ kind = \"bits\", size = {e.bits // 8}, bits = {e.bits} }},")
        else:
            raise ValueError(f"BODY_ELEMENTS[{kind!r}] says neither numpy, fields, values_of nor bits")
    out.append("local ELEMENT = {\n" + "\n".join(elements) + "\n}")
    out.append(_directory_lua())
    dir_kind, dir_e = _directory()
    table_doc = dir_e.docs.get(dir_e.table_of) or consts.FIELD_DOCS[dir_e.table_of]
    grouped = {s.item for ss in consts.BODY_LAYOUT.values() for s in ss if s.per_table}
    for item, kind in items.items():
        e = consts.BODY_ELEMENTS[kind]
        title = item.capitalize()
        if e.numpy is not None:
            ctor, _ = _numpy_field(f"embnic.{item}", title, e.numpy)
            out.append(f"hf[{lua_str(item)}] = {ctor}")
        else:
            out.append(f"hf[{lua_str(item)}] = ProtoField.bytes({lua_str('embnic.' + item)}, {lua_str(title)})")
        if item in grouped:
            out.append(f"hf[{lua_str(item + '.table')}] = " + _uint_field(
                f"embnic.{item}.table", table_doc.title, np.dtype(dict(dir_e.fields)[dir_e.table_of]).itemsize,
                desc=f"the table these {item}s are of (the directory says)"))
        if e.values_of is not None:
            out.append(f"hf[{lua_str(item + '.value')}] = ProtoField.double({lua_str(f'embnic.{item}.value')}, "
                       f"\"Value\")")
        if e.bits:
            w = _UINT[2 if e.bits <= 0x10000 else 4]
            out.append(f"hf[{lua_str(item + '.fragment')}] = ProtoField.{w}({lua_str(f'embnic.{item}.fragment')}, "
                       f"\"Fragment\", base.DEC, nil, nil, \"a fragment index whose bit is set\")")
            out.append(f"hf[{lua_str(item + '.missing')}] = ProtoField.{w}({lua_str(f'embnic.{item}.missing')}, "
                       f"\"Missing fragment\", base.DEC, nil, nil, \"a fragment of the request whose bit is clear\")")
        for fname, np_type in e.fields:
            doc = e.docs.get(fname) or consts.FIELD_DOCS.get(fname)
            vs = "nil"
            if doc is not None and doc.values is not None and not issubclass(doc.values, enum.IntFlag):
                if doc.values not in enums:
                    raise ValueError(f"BODY_ELEMENTS[{kind!r}] {fname}: its values {doc.values.__name__} have "
                                     f"no name table (name them in a header field's FieldDoc)")
                vs = enums[doc.values]
            ctor, _ = _numpy_field(f"embnic.{item}.{fname}", doc.title if doc else fname, np_type, vs,
                                   hex_=bool(doc and doc.hex), desc=doc.meaning if doc else None)
            out.append(f"hf[{lua_str(item + '.' + fname)}] = {ctor}")
    layout = []
    for t, sections in consts.BODY_LAYOUT.items():
        secs = []
        for s in sections:
            row = f"{{ name = {lua_str(s.name)}, item = {lua_str(s.item)}, element = {lua_str(s.element)}"
            if s.count is not None:
                row += f", count = {lua_str(s.count) if isinstance(s.count, str) else int(s.count)}"
            if s.nbytes is not None:
                row += f", nbytes = {lua_str(s.nbytes)}"
            if s.per_table is not None:
                row += f", per_table = {lua_str(s.per_table)}"
            secs.append(row + " }")
        layout.append(f"  [{int(t)}] = {{ {', '.join(secs)} }},  -- {t.name}" if secs
                      else f"  [{int(t)}] = {{}},  -- {t.name}")
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
--
-- What a frame shows. The header, every field named; a frame that the card (and any receiver)
-- drops from its header is flagged as an expert-info error named by the card's drop reason
-- (embnic.drop_reason; a fragment whose offset or length disagrees with its index is
-- frag_mismatch) and its body is not read. A UDP GSO send (one datagram of back-to-back frames of
-- one message, larger than the MTU: a shard's reply captured on its host before the kernel cut
-- it) is read as the frames it becomes (embnic.gso_frame). A frame carries body bytes
-- [frag_offset, frag_offset + frag_len) of its message; the dissector shows the elements of the body's sections that fall in them, numbered within their
-- section (or table), and each element cut by the fragment's edges as embnic.partial:
--   - directory entries (embnic.table.*): their position follows from the header alone;
--   - keys (embnic.key): position from the header alone; grouped per table (embnic.key.table)
--     when the message's directory is known, else numbered across the message;
--   - an update's gradients, a lookup reply's rows (embnic.gradient, embnic.row, values in
--     embnic.*.value): their tables, dims and dtypes come from the directory only, so they are
--     decoded per table when the directory is known and shown as bytes (embnic.undecoded)
--     otherwise;
--   - SIZE_REQ entries (embnic.entry.*); an UPDATE_NACK's bitmap as the fragment indices held
--     (embnic.held.fragment) and, when its update is in the capture, the ones missing.
-- The directory is known for a frame when every byte of it (fragment 0 holds it unless it is
-- longer than a fragment: above 89 tables at MTU 1500) was seen at or before that frame in
-- capture order, in frames of the same message (same client_id, msg_id, type and counts:
-- consts.MESSAGE_FIELDS), or for a reply in its request's; embnic.directory_in names the frame
-- that completed it. A directory that does not add up (codec.parse_request_body: a table
-- twice, an entry without keys, dim or dtype, counts or row bytes not the header's num_keys and
-- value_len — a LOOKUP_REQ's too: a shard answers MALFORMED) is a warning (bad_directory) and is
-- not used. Replies are linked to their requests by (client_id, msg_id) (request_in,
-- response_in, time; run tshark with -2 to see a request's link to its later reply).

local embnic = Proto("embnic", "embnic embedding parameter-server protocol")"""

_DISSECTOR_LUA = r"""-- ---- request/response tracking, drop reason, body parts ----
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
