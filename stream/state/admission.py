"""New streams of a daemon with durable state: admitted by the privacy ledger, keyed by their generation, restored
from their stored state.

:class:`AdmittedStreams` is the :class:`~stream.core.router.StreamMaker` the router is built with when ``[state]
data_dir`` is set: a stream's first reading (or the restore at the start) makes its operator here. The ledger admits
it (``Store.admit``, the entry written by the next checkpoint); its key derives from the master key, the store's
identity and its generation; a stored stream's operator is made from its snapshot (a releasing ToPS stream straight
into a row of the router's columnar store), and the record the router then makes gets the stored ``last_seq``, tick
counter, error-bar statistics and open period bins (:meth:`AdmittedStreams.made`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from operators import ToPS
from operators.columnar import RowOperator
from operators.columnar_holdout import HoldoutRow
from stream.core.keys import derive_stream_key
from stream.core.router import Router, StreamMaker, StreamRecord
from stream.state.records import apply_state, operator_snapshot
from stream.state.store import Store, StoreError

__all__ = ["AdmittedStreams"]


class AdmittedStreams(StreamMaker):
    """New streams through the store's ledger: keyed by generation, restored when stored.

    ``factory(name)`` makes an unkeyed stream (local mode, or no master key); ``keyed(key)`` a keyed one (``master``
    set). ``changed`` (the streams a checkpoint must write) gets every new stream; ``saved_in_holdout`` every stored
    stream restored in its holdout. Both are the durable state's own sets, shared."""

    def __init__(self, factory: Callable[[str], Any], keyed: Callable[[bytes], Any], *, store: Store,
                 params: Any, new_generation: set[str], master: bytes | None, identity: str,
                 changed: set[str], saved_in_holdout: set[str],
                 fleet_member: Callable[[bytes, dict[str, Any]], Any] | None = None) -> None:
        super().__init__(factory)
        self.keyed = keyed
        self.store = store
        self.params = params
        self.new_generation = new_generation
        self.master = master
        self.identity = identity
        self.changed = changed
        self.saved_in_holdout = saved_in_holdout
        self.fleet_member = fleet_member  # a stored stream the template's fleet holdout took readings of
        self.generations: dict[str, int] = {}  # the generation of a stream being made, for its record
        self.restored: dict[str, dict[str, Any]] = {}  # the stored state of a stream being made, for its record
        self.released_from: dict[str, int] = {}  # the same, for a fleet stream's first release tick
        self._kind: tuple[type, Any] | None = None  # (operator class, its configuration): the same for every stream

    def operator(self, name: str, router: Router) -> Any:
        """The operator of ``name``: admitted by the ledger, keyed by its generation, restored when stored."""
        # the ledger entry of a new stream is written by the next checkpoint (Store.admit, defer)
        adm = self.store.admit(name, self.params, new_generation=name in self.new_generation, defer=True)
        self.generations[name] = adm.generation  # for its record's status (made)
        master = self.master
        key: bytes | None = None
        if master is not None:
            key = derive_stream_key(master, name, identity=self.identity, generation=adm.generation)
        kind = self._kind
        if adm.state is None or kind is None:  # a new stream (or the first of this run: its kind is learnt)
            op = self.keyed(key) if key is not None else self.factory(name)
            born_row = type(op) is HoldoutRow or type(op) is RowOperator
            if key is not None:  # a new stream may be born a row (Router.holdout_row, Router.release_row): ToPS
                self._kind = (ToPS if born_row else type(op), op.config)
            if adm.state is None:
                self.changed.add(name)
                return op
            if born_row:  # made only to learn the kind: its row goes back
                op.free()
            kind = self._kind or (type(op), op.config)
        try:  # a stored stream: its operator is made from the snapshot (no fresh one built first)
            snap = operator_snapshot(adm.state, kind[1])
            member = None if self.fleet_member is None or key is None else self.fleet_member(key, snap)
            if self.fleet_member is not None:
                kind = (ToPS, kind[1])  # a fleet-holdout template's stored streams: its members, or ToPS streams
            pool = router.pool
            row = pool.add_snapshot(kind[1], key, snap) if (member is None and pool is not None and kind[0] is ToPS
                                                            and key is not None) else None
            # a releasing stream goes straight into a row of the columnar store (the router's _adopt would move it
            # there anyway); any other is restored as its operator
            op = member if member is not None else RowOperator(pool, row) if row is not None \
                else kind[0].restore(kind[1], key, snap)
        except (KeyError, TypeError, ValueError) as exc:
            # the exception's text may quote the stored state (a holdout's counts are private): its type only
            msg = (f"stream {name!r}: the stored state does not fit the configuration ({type(exc).__name__}); its "
                   f"readings are refused (restore the old configuration, or start a new generation: "
                   f"--new-generation {name})")
            raise StoreError(msg) from None
        self.restored[name] = adm.state
        if member is not None and member.phase == "releasing":  # stored in the fleet holdout, which has chosen since:
            self.released_from[name] = member.ticks  # its hierarchy starts after the readings the holdout took
        if op.phase == "holdout":
            self.saved_in_holdout.add(name)
        return op

    def made(self, rec: StreamRecord) -> None:
        """The record of a stream just made: its generation, and a stored stream's last ``seq``, tick counter,
        error-bar statistics and open period bins."""
        name = rec.name
        rec.generation = self.generations.pop(name, rec.generation)
        state = self.restored.pop(name, None)
        if state is not None:
            apply_state(rec, state)
        start = self.released_from.pop(name, None)
        if start is not None:
            rec.released_from = start
