"""A P4Runtime client for the bmv2 target: arbitration (one election id), the pipeline, table
entries by P4Info ids (:class:`P4InfoIndex`), through finsy's generated messages and stub over
synchronous grpcio (p4/README.md "Control plane" says why). Values are P4Runtime's canonical
bytestrings; registers and counters stay on Thrift (p4lang/PI#376).

    with P4RuntimeClient("unix:/run/embnic/embnic.p4rt") as c:
        c.become_primary()
        c.set_pipeline(P4InfoIndex.load(p4info_path), json_path.read_bytes())
        c.write([TableEntry("route_by_shard", (0,), "forward_to_server", (1, mac, ip, 9000))])
"""
from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
from pathlib import Path
from typing import Iterable, Sequence

from embnic.control.errors import MissingDependencyError

#: the election id this project's controller always uses (P4Runtime arbitration: one primary)
ELECTION_ID = 1
#: how to get the Python side of P4Runtime when it is missing
INSTALL_HINT = "pip install 'embnic[p4runtime]' (finsy, grpcio)"


def _proto():
    """``(p4r, p4r_grpc, p4i, rpc_status, grpc, text_format)``, or MissingDependencyError."""
    try:
        import grpc
        from finsy.proto import p4i, p4r, p4r_grpc, rpc_status
        from google.protobuf import text_format
    except ImportError as e:
        raise MissingDependencyError(f"P4Runtime needs the Python packages finsy and grpcio ({e}): "
                                     f"{INSTALL_HINT}", dependency="finsy") from None
    return p4r, p4r_grpc, p4i, rpc_status, grpc, text_format


def require() -> None:
    """Raise :class:`MissingDependencyError` (naming finsy/grpcio and the pip line) unless the
    P4Runtime client's Python packages import."""
    _proto()


def available() -> bool:
    """True if the P4Runtime client's Python packages import (finsy, grpcio)."""
    try:
        _proto()
    except MissingDependencyError:
        return False
    return True


class P4RuntimeError(Exception):
    """A P4Runtime call failed: the gRPC status and, for writes, each failed update's error."""

    def __init__(self, message: str, code: str = "", errors: Sequence[str] = ()):
        super().__init__(message)
        self.code = code
        self.errors = list(errors)


# --------------------------------------------------------------------------- values
def encode(value: int, bitwidth: int) -> bytes:
    """``value`` as a P4Runtime canonical bytestring (big-endian, shortest, zero is ``b"\\x00"``).

    Raises:
        ValueError: negative, or wider than ``bitwidth`` bits.
    """
    value = int(value)
    if value < 0 or value >> bitwidth:
        raise ValueError(f"{value} does not fit {bitwidth} bits")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def decode(data: bytes) -> int:
    """A P4Runtime bytestring (any width, big-endian) as an int."""
    return int.from_bytes(data, "big")


# --------------------------------------------------------------------------- P4Info
@dataclasses.dataclass(frozen=True)
class TableEntry:
    """One exact-match table entry by names: ``key`` in the table's match-field order, ``params``
    in the action's parameter order, every value an unsigned int of its field's width."""

    table: str
    key: tuple[int, ...]
    action: str
    params: tuple[int, ...] = ()

    def cli_add(self) -> str:
        """The same entry as a ``simple_switch_CLI`` line (values in decimal)."""
        return (f"table_add {self.table} {self.action} {' '.join(str(k) for k in self.key)} => "
                f"{' '.join(str(p) for p in self.params)}").rstrip()


@dataclasses.dataclass(frozen=True)
class _Table:
    id: int
    fields: tuple[tuple[str, int, int], ...]   #: (name, id, bitwidth), P4Info order
    actions: frozenset[int]


@dataclasses.dataclass(frozen=True)
class _Action:
    id: int
    name: str
    params: tuple[tuple[str, int, int], ...]   #: (name, id, bitwidth)


class P4InfoIndex:
    """Names ↔ ids of one P4Info (tables with their exact match fields, actions with their
    parameters) and the P4Info message itself (``.p4info``).

    Raises (constructor):
        P4RuntimeError: a table has a match field that is not EXACT (this client writes exact
            entries only; the embnic program has no other).
    """

    def __init__(self, p4info):
        self.p4info = p4info
        self.tables: dict[str, _Table] = {}
        self.actions: dict[str, _Action] = {}
        self._action_by_id: dict[int, _Action] = {}
        p4i = _proto()[2]
        for t in p4info.tables:
            for f in t.match_fields:
                if f.match_type != p4i.MatchField.EXACT:
                    raise P4RuntimeError(f"table {t.preamble.name}: match field {f.name} is not EXACT")
            self.tables[t.preamble.name] = _Table(t.preamble.id, tuple((f.name, f.id, f.bitwidth)
                                                                       for f in t.match_fields),
                                                  frozenset(a.id for a in t.action_refs))
        for a in p4info.actions:
            act = _Action(a.preamble.id, a.preamble.name, tuple((p.name, p.id, p.bitwidth) for p in a.params))
            self.actions[a.preamble.name] = act
            self._action_by_id[act.id] = act
        self._table_by_id = {t.id: name for name, t in self.tables.items()}

    @classmethod
    def load(cls, path: str | Path) -> "P4InfoIndex":
        """Read a P4Info file as p4c writes it (``--p4runtime-files``): text format (``.txtpb``,
        ``.txt``) or binary (``.bin``).

        Raises:
            P4RuntimeError: the file does not parse (its path and the parser's message).
            OSError: it cannot be read.
        """
        p4r, _, p4i, _, _, text_format = _proto()
        path = Path(path)
        msg = p4i.P4Info()
        try:
            if path.suffix == ".bin":
                msg.ParseFromString(path.read_bytes())
            else:
                text_format.Parse(path.read_text(), msg)
        except (text_format.ParseError, Exception) as e:  # DecodeError has no stable home across versions
            if isinstance(e, OSError):
                raise
            raise P4RuntimeError(f"{path}: not a P4Info file: {e}") from None
        return cls(msg)

    def table(self, name: str) -> _Table:
        """The table called ``name``; P4RuntimeError naming the tables there are otherwise."""
        try:
            return self.tables[name]
        except KeyError:
            raise P4RuntimeError(f"no table {name!r} in the P4Info (tables: {', '.join(sorted(self.tables))})") from None

    def action(self, name: str) -> _Action:
        """The action called ``name``; P4RuntimeError otherwise."""
        try:
            return self.actions[name]
        except KeyError:
            raise P4RuntimeError(f"no action {name!r} in the P4Info") from None

    def to_proto(self, e: TableEntry):
        """``e`` as a ``p4.v1.TableEntry``.

        Raises:
            P4RuntimeError: unknown table/action, an action the table does not take, or the
                wrong number of key fields or parameters.
            ValueError: a value wider than its field.
        """
        p4r = _proto()[0]
        t, a = self.table(e.table), self.action(e.action)
        if a.id not in t.actions:
            raise P4RuntimeError(f"table {e.table} has no action {e.action}")
        if len(e.key) != len(t.fields) or len(e.params) != len(a.params):
            raise P4RuntimeError(f"{e.table}/{e.action}: {len(e.key)} key fields and {len(e.params)} parameters "
                                 f"given, the P4Info has {len(t.fields)} and {len(a.params)}")
        return p4r.TableEntry(
            table_id=t.id,
            match=[p4r.FieldMatch(field_id=fid, exact=p4r.FieldMatch.Exact(value=encode(v, bw)))
                   for (_, fid, bw), v in zip(t.fields, e.key)],
            action=p4r.TableAction(action=p4r.Action(action_id=a.id, params=[
                p4r.Action.Param(param_id=pid, value=encode(v, bw)) for (_, pid, bw), v in zip(a.params, e.params)])))

    def from_proto(self, msg) -> TableEntry:
        """A read ``p4.v1.TableEntry`` as a :class:`TableEntry` (fields and parameters in P4Info order).

        Raises:
            P4RuntimeError: an id the P4Info does not have.
        """
        name = self._table_by_id.get(msg.table_id)
        if name is None:
            raise P4RuntimeError(f"read an entry of table id {msg.table_id}, not in the P4Info")
        t = self.tables[name]
        got = {m.field_id: decode(m.exact.value) for m in msg.match}
        act = self._action_by_id.get(msg.action.action.action_id)
        if act is None:
            raise P4RuntimeError(f"read an entry of {name} with action id {msg.action.action.action_id}, not in the P4Info")
        params = {p.param_id: decode(p.value) for p in msg.action.action.params}
        return TableEntry(name, tuple(got.get(fid, 0) for _, fid, _ in t.fields), act.name,
                          tuple(params.get(pid, 0) for _, pid, _ in act.params))


# --------------------------------------------------------------------------- the client
class P4RuntimeClient:
    """One gRPC channel to a P4Runtime server (device ``device_id``).

    Reads need nothing else; :meth:`set_pipeline` and :meth:`write` need :meth:`become_primary`
    first (the arbitration stream stays open until :meth:`close`).

    Args:
        address: gRPC target, e.g. ``unix:/run/embnic/NAME.p4rt`` or ``127.0.0.1:9559``.
        device_id: the switch's ``--device-id`` (0 by default on BMv2).
        timeout: seconds for each RPC and for the arbitration answer.
    """

    def __init__(self, address: str, device_id: int = 0, *, timeout: float = 30.0):
        p4r, p4r_grpc, _, _, grpc, _ = _proto()
        self.address = address
        self.device_id = int(device_id)
        self.timeout = float(timeout)
        self._channel = grpc.insecure_channel(address)
        self._stub = p4r_grpc.P4RuntimeStub(self._channel)
        self._requests: queue.Queue | None = None
        self._stream = None
        self.index: P4InfoIndex | None = None

    # ---- errors
    def _error(self, what: str, e) -> P4RuntimeError:
        """A grpc.RpcError as a P4RuntimeError, with each failed update's P4Runtime error
        (``p4.v1.Error`` details of the status, as P4Runtime servers report a Write)."""
        p4r, _, _, rpc_status, grpc, _ = _proto()
        names = {c.value[0]: c.name for c in grpc.StatusCode}
        errors = []
        for k, v in (e.trailing_metadata() or ()) if hasattr(e, "trailing_metadata") else ():
            if k != "grpc-status-details-bin":
                continue
            for i, d in enumerate(rpc_status.Status.FromString(v).details):
                err = p4r.Error()
                if d.Unpack(err) and err.canonical_code != 0:
                    errors.append(f"update {i}: {names.get(err.canonical_code, err.canonical_code)} {err.message}")
        code = e.code().name if hasattr(e, "code") and e.code() else ""
        detail = e.details() if hasattr(e, "details") else str(e)
        msg = f"P4Runtime {what} at {self.address}: {code} {detail}".rstrip()
        if errors:
            msg += " (" + "; ".join(errors) + ")"
        return P4RuntimeError(msg, code, errors)

    def _rpc(self, method: str, req, what: str | None = None):
        """The answer of ``METHOD(req)`` (a streamed one as a list); a grpc.RpcError as :meth:`_error`
        of ``what`` (default: the method)."""
        try:
            answer = getattr(self._stub, method)(req, timeout=self.timeout)
            return list(answer) if method == "Read" else answer
        except _proto()[4].RpcError as e:
            raise self._error(what or method, e) from None

    def wait_ready(self, timeout: float) -> None:
        """Wait until the server accepts connections.

        Raises:
            P4RuntimeError: not within ``timeout`` s.
        """
        grpc = _proto()[4]
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise P4RuntimeError(f"no P4Runtime server at {self.address} after {timeout:g} s") from None

    # ---- arbitration
    def become_primary(self, election_id: int = ELECTION_ID) -> None:
        """Open the ``StreamChannel`` and win arbitration with ``election_id``.

        Raises:
            P4RuntimeError: the server refused, another controller with a higher (or the same)
                election id is primary, or no answer within the timeout.
        """
        p4r = _proto()[0]
        if self._stream is not None:
            return
        self._requests = queue.Queue()
        self._requests.put(p4r.StreamMessageRequest(arbitration=p4r.MasterArbitrationUpdate(
            device_id=self.device_id, election_id=p4r.Uint128(high=0, low=int(election_id)))))
        # the requests until close() puts None
        self._stream = self._stub.StreamChannel(iter(self._requests.get, None))
        answer: list = []

        def first():
            try:
                answer.append(next(self._stream))
            except Exception as e:  # noqa: BLE001 - the RpcError is reported below
                answer.append(e)

        th = threading.Thread(target=first, daemon=True)
        th.start()
        th.join(self.timeout)
        if not answer:
            self.close()
            raise P4RuntimeError(f"P4Runtime arbitration at {self.address}: no answer in {self.timeout:g} s")
        got = answer[0]
        if isinstance(got, Exception):
            self.close()
            raise self._error("arbitration", got)
        st = got.arbitration.status
        if not got.HasField("arbitration") or st.code != 0:
            self.close()
            raise P4RuntimeError(f"P4Runtime arbitration at {self.address}: not primary (election id "
                                 f"{election_id}): {st.message or 'another controller is'}")

    def close(self) -> None:
        """End the arbitration stream (if open) and the channel."""
        if self._requests is not None:
            self._requests.put(None)
        if self._stream is not None:
            with contextlib.suppress(Exception):
                self._stream.cancel()
        self._stream = self._requests = None
        self._channel.close()

    def __enter__(self) -> "P4RuntimeClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- pipeline
    def set_pipeline(self, index: P4InfoIndex, device_config: bytes, cookie: int = 0) -> None:
        """``SetForwardingPipelineConfig`` (VERIFY_AND_COMMIT) of ``index.p4info`` and the BMv2
        JSON ``device_config``; later calls of this client use ``index``.

        Raises:
            P4RuntimeError: not primary, or the switch refused the pipeline.
        """
        p4r = _proto()[0]
        self._require_primary("SetForwardingPipelineConfig")
        req = p4r.SetForwardingPipelineConfigRequest(
            device_id=self.device_id, election_id=p4r.Uint128(high=0, low=ELECTION_ID),
            action=p4r.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT,
            config=p4r.ForwardingPipelineConfig(p4info=index.p4info, p4_device_config=device_config,
                                                cookie=p4r.ForwardingPipelineConfig.Cookie(cookie=cookie)))
        self._rpc("SetForwardingPipelineConfig", req)
        self.index = index

    def get_p4info(self) -> P4InfoIndex:
        """The P4Info of the pipeline the switch runs (``GetForwardingPipelineConfig``); later
        calls of this client use it.

        Raises:
            P4RuntimeError: the call failed, or no pipeline is set.
        """
        p4r = _proto()[0]
        req = p4r.GetForwardingPipelineConfigRequest(
            device_id=self.device_id, response_type=p4r.GetForwardingPipelineConfigRequest.P4INFO_AND_COOKIE)
        resp = self._rpc("GetForwardingPipelineConfig", req)
        if not resp.config.HasField("p4info"):
            raise P4RuntimeError(f"P4Runtime at {self.address}: no pipeline set")
        self.index = P4InfoIndex(resp.config.p4info)
        return self.index

    def _require_primary(self, what: str) -> None:
        if self._stream is None:
            raise P4RuntimeError(f"{what} needs arbitration first (become_primary)")

    def _index(self) -> P4InfoIndex:
        return self.index if self.index is not None else self.get_p4info()

    # ---- entries
    def write(self, inserts: Iterable[TableEntry] = (), modifies: Iterable[TableEntry] = (),
              deletes: Iterable[TableEntry] = ()) -> None:
        """One ``Write`` of every insert, modify and delete (in that order; deletes match by key).

        Raises:
            P4RuntimeError: not primary, or an update was refused (each refusal in the message:
                an insert of an existing key is ALREADY_EXISTS, a delete of a missing one NOT_FOUND).
            ValueError: a value wider than its field.
        """
        p4r = _proto()[0]
        self._require_primary("Write")
        idx = self._index()
        ups = [p4r.Update(type=p4r.Update.INSERT, entity=p4r.Entity(table_entry=idx.to_proto(e))) for e in inserts]
        ups += [p4r.Update(type=p4r.Update.MODIFY, entity=p4r.Entity(table_entry=idx.to_proto(e))) for e in modifies]
        for e in deletes:
            msg = idx.to_proto(e)
            msg.ClearField("action")
            ups.append(p4r.Update(type=p4r.Update.DELETE, entity=p4r.Entity(table_entry=msg)))
        if not ups:
            return
        req = p4r.WriteRequest(device_id=self.device_id, election_id=p4r.Uint128(high=0, low=ELECTION_ID),
                               updates=ups, atomicity=p4r.WriteRequest.CONTINUE_ON_ERROR)
        self._rpc("Write", req)

    def read_table(self, table: str) -> list[TableEntry]:
        """Every entry of ``table`` (the default entry left out), in the switch's order.

        Raises:
            P4RuntimeError: unknown table, or the read failed.
        """
        p4r = _proto()[0]
        idx = self._index()
        req = p4r.ReadRequest(device_id=self.device_id, entities=[
            p4r.Entity(table_entry=p4r.TableEntry(table_id=idx.table(table).id))])
        return [idx.from_proto(ent.table_entry) for resp in self._rpc("Read", req, f"Read of {table}")
                for ent in resp.entities if ent.HasField("table_entry") and not ent.table_entry.is_default_action]
