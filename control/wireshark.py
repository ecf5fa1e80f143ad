"""The Wireshark dissector of the embnic protocol, generated from the one field table.

:func:`generate_lua` writes a Wireshark Lua plug-in (``embnic dissector --out embnic.lua``;
the shipped copy is ``contrib/wireshark/embnic.lua``, which a test regenerates and compares).
Nothing in it is written per field: every header field's offset and size comes from
:data:`consts.HEADER_FIELDS`, its name, meaning, value names and validity check from
:data:`consts.FIELD_DOCS`, the header's count rules from :data:`consts.HEADER_COUNT_RULES`,
the body from :data:`consts.BODY_LAYOUT` and :data:`consts.BODY_ELEMENTS`, the request/reply
pairs from :data:`consts.ANSWERS`; the Lua code around those tables interprets them.

What the plug-in shows (Wireshark 3.4+, Lua 5.2+; checked with tshark 4.0 by
``tests/control/test_wireshark.py``) is README "Captures in Wireshark": every field named, a
frame checked as the card checks it (docs/protocol.md "Validity", in the card's order) with the
first failure flagged as an expert-info error named by the card's drop reason, a request whose
directory does not add up to its header as a warning, a UDP GSO send read as the frames it
becomes, each fragment's part of the body, and requests and replies tracked by
:data:`consts.TRANSACTION_KEY` (the card's state-map key).

Layout of the generated file: header, value-name tables, header fields (:func:`_header_lua`),
body (:func:`_body_lua`, the only part that knows the body layout), then the fixed dissector
code (:data:`DISSECTOR_LUA`, ``control/wireshark.lua``).
"""
from __future__ import annotations

import enum

from pathlib import Path

import numpy as np

from embnic.client_lib import consts
from embnic.control.errors import OperationalError, UsageError

#: where the shipped plug-in lives in the repository
SHIPPED_PATH = "contrib/wireshark/embnic.lua"
#: the fixed Lua code that follows the generated tables (request/reply tracking, the frame checks,
#: the body parts, the registration): a Lua file beside this module, package data
DISSECTOR_LUA = Path(__file__).with_name("wireshark.lua")

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


def _uint_field(abbrev: str, title: str, size: int | str, *, hex_: bool = False, values: str = "nil",
                desc: str | None = None) -> str:
    """The ProtoField of an unsigned field of ``size`` bytes, or of a body's scalar of numpy type
    ``size`` (little-endian, unsigned)."""
    if isinstance(size, str):
        if np.dtype(size).kind != "u":
            raise ValueError(f"{abbrev}: body scalar {size!r} is not an unsigned integer")
        size = np.dtype(size).itemsize
    if size not in _UINT:
        raise ValueError(f"{abbrev}: no Wireshark unsigned field of {size} bytes")
    base = "base.HEX" if hex_ else "base.DEC"
    return (f"ProtoField.{_UINT[size]}({lua_str(abbrev)}, {lua_str(title)}, {base}, {values}, nil"
            + (f", {lua_str(desc)})" if desc else ")"))


def _value_tables() -> tuple[str, dict[type, str]]:
    """Lua tables of value names, one per enum some field names (``vs_MsgType``, ...)."""
    docs = list(consts.FIELD_DOCS.values()) + [d for e in consts.BODY_ELEMENTS.values() for d in e.docs.values()]
    enums = {d.values: f"vs_{d.values.__name__}" for d in docs if d.values is not None}  # first seen first
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
    secs = [s for ss in consts.BODY_LAYOUT.values() for s in ss]
    row_secs = [s for s in secs if s.per_table and consts.BODY_ELEMENTS[s.element].values_of]
    counts = {s.count for s in secs if s.element == dir_kind}
    per_table = {s.per_table for s in secs if s.per_table}
    totals = {s.count for s in secs if s.per_table and s.count}
    rows = {consts.BODY_ELEMENTS[s.element].values_of for s in row_secs}
    # the header field that sizes every section of rows (a lookup reply's, an update's gradients):
    # a directory's rows add up to it in every message that has one (a LOOKUP_REQ announces its
    # reply's rows by it), as a host checks (codec.parse_request_body)
    row_bytes = {s.nbytes for s in row_secs}
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
            out.append(f"hf[{lua_str(item)}] = " + _uint_field(f"embnic.{item}", title, e.numpy))
        else:
            out.append(f"hf[{lua_str(item)}] = ProtoField.bytes({lua_str('embnic.' + item)}, {lua_str(title)})")
        if item in grouped:
            out.append(f"hf[{lua_str(item + '.table')}] = " + _uint_field(
                f"embnic.{item}.table", table_doc.title, np.dtype(dict(dir_e.fields)[dir_e.table_of]).itemsize,
                desc=f"the table these {item}s are of (the directory says)"))
        if e.values_of is not None:
            out.append(f"hf[{lua_str(item + '.value')}] = ProtoField.double({lua_str(f'embnic.{item}.value')}, "
                       f"\"Value\")")
        for sub, sub_title, desc in (("fragment", "Fragment", "a fragment index whose bit is set"),
                                     ("missing", "Missing fragment", "a fragment of the request whose bit is clear")
                                     ) if e.bits else ():
            out.append(f"hf[{lua_str(f'{item}.{sub}')}] = " + _uint_field(
                f"embnic.{item}.{sub}", sub_title, 2 if e.bits <= 0x10000 else 4, desc=desc))
        for fname, np_type in e.fields:
            doc = e.docs.get(fname) or consts.FIELD_DOCS.get(fname)
            vs = "nil"
            if doc is not None and doc.values is not None and not issubclass(doc.values, enum.IntFlag):
                if doc.values not in enums:
                    raise ValueError(f"BODY_ELEMENTS[{kind!r}] {fname}: its values {doc.values.__name__} have "
                                     f"no name table (name them in a header field's FieldDoc)")
                vs = enums[doc.values]
            out.append(f"hf[{lua_str(item + '.' + fname)}] = " + _uint_field(
                f"embnic.{item}.{fname}", doc.title if doc else fname, np_type, values=vs,
                hex_=bool(doc and doc.hex), desc=doc.meaning if doc else None))
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
             DISSECTOR_LUA.read_text()]
    return "\n\n".join(parts).rstrip() + "\n"


_HEAD_LUA = """\
-- embnic.lua: Wireshark dissector for the embnic wire protocol, version {version} (docs/protocol.md).
--
-- GENERATED by `embnic dissector` (embnic.control.wireshark) from client_lib/consts.py:
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
