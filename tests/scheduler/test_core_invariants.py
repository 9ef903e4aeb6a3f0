"""Hypothesis stateful test of the decision core's invariants.

Random sequences of admits, turns a dataplane placed itself on an open replica (as the rule
says, or on one that closed since it last heard), turn ends (finished, failed, abandoned),
abandoned held turns, probes, run ends, ticks, resyncs and dataplane disconnects. After every
step:

- never over capacity: a capped replica that received a turn holds at most its cap; a
  preemptive one ("c") may take interactive turns beyond it, but never more interactive turns
  than its cap (the engine must have batch work to preempt), and batch never beyond it;
- never on an unhealthy replica, nor on one that does not serve the turn's model;
- a generating or tool-paused run's turn goes to its replica while that replica is healthy, and
  so does an idle run's while it is resident there (until a tick gives up its wait);
- the KV rule: a new run starts on a replica with a known KV pool only while it and the runs
  resident there fit their share of the pool (or nothing is resident there), unless it was held
  past the longest hold;
- batch respects paused-interactive headroom: a batch turn placed on a capped replica that does
  not preempt leaves at least one free slot per interactive run paused on a tool there;
- fairness: no turn still held was passed over by a turn placed in the same step that it
  could have taken the slot of, of a class no better and of a caller with more turns in flight
  (or as many, and later);
- every held turn is placed once capacity allows: after a step, no held turn could be placed;
- after a Resync, the runs and turns the dataplane reported are what the scheduler holds;
- a dataplane gone past its grace period has no turns left in flight;
- derived counters and indexes (in flight per replica and per caller, headroom, the queue each
  held turn sits in, each replica's resident tokens and new-run flags) equal what the turns and
  runs themselves say, and equal their rebuild from the runs; turns placed by a dataplane
  on a replica that closed meanwhile are counted like any other (and only they may exceed a cap);
- the open-replica version moves whenever the set of open replicas changes;
- a run taken from a dataplane was that dataplane's, and is now another's.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from luftpause.common.config import Endpoint, Priorities
from luftpause.scheduler.core import shares, slots
from luftpause.scheduler.core.decide import decide, initial_state
from luftpause.scheduler.core.events import (
    Action,
    Admit,
    DataplaneConnected,
    DataplaneDisconnected,
    Event,
    FirstToken,
    Place,
    ProbeResult,
    Resync,
    RunEnded,
    RunSnapshot,
    RunTaken,
    Tick,
    TurnAbandoned,
    TurnFailed,
    TurnFinished,
    TurnSnapshot,
    TurnStarted,
)
from luftpause.scheduler.core.model import (
    DATAPLANE_GRACE_S,
    Phase,
    Rules,
    ServiceClass,
    Turn,
    limit_of,
)
from luftpause.scheduler.core.placement import (
    choose_replica,
    open_replicas,
)
from luftpause.scheduler.core.queues import bucket_of
from luftpause.scheduler.core.state import State
from tests.scheduler.invariant_checks import (
    after_turns,
    check_kv_rule,
    check_rebuilds,
    check_residency,
    could_take,
    may_unpin,
    stays_home,
)

REPLICAS = {"a": {"m1", "m2"}, "b": {"m1"}, "c": {"m2"}}
PREEMPTIVE = Priorities(interactive=0, batch=100, preemptive=True)
SLOTS = {"b": 2}  # b's engine slots are the scheduler's to assign
SAVES = {"b": 2}  # and it keeps two saved contexts on its engine's disk
# c's KV pool is in the endpoint file: a batching engine, capped only at the most it runs,
# which its probes report (3); a and b are capped by their queues.
KV = {"c": 1500}
RUNS = [f"r{i}" for i in range(8)]
# Openings of new runs: none, a shared system prompt, or that and a task of its own.
OPENINGS: list[tuple[tuple[int, int], ...]] = [(), ((11, 100),), ((11, 100), (12, 900))]
CALLERS = ["x", "y", "z"]
DATAPLANES = ["dp1", "dp2"]


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        endpoints = [
            Endpoint(
                id=r,
                url=f"http://{r}:1",
                models=frozenset(m),
                priority=PREEMPTIVE if r == "c" else None,
                slots=SLOTS.get(r, 0),
                slot_saves=SAVES.get(r, 0),
                kv_tokens=KV.get(r, 0),
            )
            for r, m in REPLICAS.items()
        ]
        self.endpoints = endpoints
        self.state: State = initial_state(endpoints)
        self.now = 0.0
        self.turn_no = 0
        self.gone_since: dict[str, float] = {}
        # What the dataplanes last heard was open: it may lag the state by a few steps.
        self.heard_open: tuple[str, ...] = ()

    @initialize(off=st.sets(st.sampled_from(Rules.names())))
    def switch_rules(self, off: set[str]) -> None:
        """Any set of rules switched off (or `headroom` on): every invariant holds for each."""
        rules = Rules().switched(off, on=False)
        if "headroom" in off:  # off by default: drawing it means on
            rules = rules.switched(["headroom"], on=True)
        self.state = initial_state(self.endpoints, rules=rules)

    def step(self, event: Event) -> tuple[Action, ...]:
        before = self.state
        self.state, actions = decide(before, event)
        opened = {r.id for r in open_replicas(self.state)}
        if opened != {r.id for r in open_replicas(before)}:
            assert self.state.open_version != before.open_version, "open set changed silently"
        last_taken: dict[str, str] = {}
        for taken in (a for a in actions if isinstance(a, RunTaken)):
            old = before.runs.get(taken.run_id)
            owners = {old.dataplane if old else "", getattr(event, "dataplane", "")}
            owners |= {t.dataplane for t in after_turns(self.state, taken.run_id)}
            assert taken.dataplane in owners - {""}, "taken from a dataplane that did not have it"
            last_taken[taken.run_id] = taken.dataplane
        for run_id, dataplane in last_taken.items():
            assert self.state.runs[run_id].dataplane != dataplane, "taken by the one that has it"
        if isinstance(event, Admit) and event.placed_on:
            # Its own Place is the record of where it went, not a decision to check.
            actions = tuple(
                a for a in actions if not (isinstance(a, Place) and a.turn_id == event.turn_id)
            )
        self.check_placements(before, event, actions)
        return actions

    def check_saves(self, before: State, action: Place, turn: Turn) -> None:
        """A save keeps the context of a run that comes back, in a file not read by the same
        turn; a restore reads the placed run's own file, never when its context is in the slot.
        """
        if action.slot_save is None and action.slot_restore is None:
            return
        old = before.replicas[action.replica_id]
        files = {slots.save_file(old.id, i): i for i in range(len(old.saves))}
        holder = old.slot_runs[turn.slot]
        assert holder != turn.run_id, "a slot holding the run's own context was moved"
        assert action.slot_save != action.slot_restore, "a file saved and read by one turn"
        if action.slot_restore is not None:
            assert old.saves[files[action.slot_restore]] == turn.run_id, "restored another run"
        if action.slot_save is not None:
            # The holder's record as the placement saw it: before the step, or as a turn of it
            # that ended earlier in the same step left it (its replica is that turn's).
            seen = [r for r in (before.runs.get(holder), self.state.runs.get(holder)) if r]
            wanted = [r for r in seen if r.replica == old.id]
            assert wanted, "saved the context of a run that is not on this replica"
            assert any(r.phase is not Phase.IDLE or r.resident for r in wanted), (
                "saved a context not wanted back"
            )
            assert self.state.replicas[old.id].saves[files[action.slot_save]] == holder

    def check_placements(self, before: State, event: Event, actions: tuple[Action, ...]) -> None:
        after = self.state
        places = [a for a in actions if isinstance(a, Place)]
        seen_runs: set[str] = set()
        per_replica = Counter(a.replica_id for a in places)
        for action in places:
            replica = after.replicas[action.replica_id]
            turn = after.turns[action.turn_id]
            assert action.engine_slot == (turn.slot if turn.slot >= 0 else None)
            self.check_saves(before, action, turn)
            if replica.slots and replica.in_flight <= replica.slots:
                assert turn.slot >= 0, "a slot was free but the turn got none"
            old = before.replicas[replica.id]
            mine = [s for s, run in enumerate(old.slot_runs) if run == turn.run_id]
            if per_replica[replica.id] == 1 and turn.run_id in before.runs:
                # Slots of turns that ended in this step (timed out, released) are free too.
                ended = {
                    t.slot
                    for t in before.turns.values()
                    if t.replica == replica.id and t.id not in after.turns
                }
                free_mine = [s for s in mine if s not in old.busy_slots - ended]
                if free_mine:
                    assert turn.slot in free_mine, "a run's own idle slot was given away"
            assert replica.healthy, "placed on an unhealthy replica"
            assert turn.model in replica.models, "placed on a replica without the model"
            if replica.capacity is not None:
                interactive = turn.service_class is ServiceClass.INTERACTIVE
                if replica.preemptive and interactive:
                    assert replica.interactive_in_flight <= replica.capacity, "nothing to preempt"
                else:
                    assert replica.in_flight <= replica.capacity, "over capacity"
                if not interactive and not replica.preemptive:
                    free = replica.capacity - replica.in_flight
                    assert free >= replica.paused_interactive, "batch took a kept slot"
            run = before.runs.get(turn.run_id)
            if turn.run_id in seen_runs:
                continue  # an earlier placement this step already moved the run
            seen_runs.add(turn.run_id)
            stays = run is not None and stays_home(before, run)
            if run is not None and stays and not may_unpin(before, event, run.id):
                home = after.replicas.get(run.replica)
                if home is not None and home.healthy and turn.model in home.models:
                    assert action.replica_id == run.replica, "pinned or resident run moved"
        self.check_fairness(before, event.at, places)
        check_kv_rule(before, after, event, places)

    def check_fairness(self, before: State, at: float, places: list[Place]) -> None:
        """Counts only grow while a step drains, so each caller's count when a turn was
        chosen is its count after the step less its placements from that turn on. An
        interactive turn waits while a batch one goes only past its class's share (`shares`:
        the counts per class it reads are the same after the step as when the drain ran)."""
        after = self.state
        for i, action in enumerate(places):
            placed = after.turns[action.turn_id]
            was = before.held.get(placed.id)
            seq = was.seq if was is not None else before.next_seq
            later = sum(1 for a in places[i:] if after.turns[a.turn_id].caller == placed.caller)
            placed_key = (after.caller_in_flight.get(placed.caller, 0) - later, seq)
            for held in after.held.values():
                if not (
                    could_take(before, held, action.replica_id)
                    and could_take(after, held, action.replica_id)
                ):
                    continue
                if held.service_class is not placed.service_class:
                    assert held.service_class is ServiceClass.BATCH or shares.past_share(
                        after, held.model, at
                    ), f"interactive {held.id} waits while batch {placed.id} was placed"
                    continue
                if held.service_class is ServiceClass.INTERACTIVE and (
                    shares.past_share(after, held.model, at)
                    and not shares.past_share(after, placed.model, at)
                ):
                    continue  # the models' pools differ: only the one within its share goes
                held_key = (after.caller_in_flight.get(held.caller, 0), held.seq)
                assert not held_key < placed_key, f"{held.id} passed over by {placed.id}"

    @rule(
        run=st.sampled_from(RUNS),
        caller=st.sampled_from(CALLERS),
        batch=st.booleans(),
        model=st.sampled_from(["m1", "m2"]),
        dt=st.floats(0, 5),
        dataplane=st.sampled_from(DATAPLANES),
        size=st.sampled_from([0, 800, 4000]),
        opens=st.sampled_from([0, 1, 2]),
    )
    def admit(
        self,
        run: str,
        caller: str,
        batch: bool,
        model: str,
        dt: float,
        dataplane: str,
        size: int = 800,
        opens: int = 0,
    ) -> None:
        self.now += dt
        self.turn_no += 1
        cls = ServiceClass.BATCH if batch else ServiceClass.INTERACTIVE
        self.step(
            Admit(
                at=self.now,
                turn_id=f"t{self.turn_no}",
                run_id=run,
                model=model,
                service_class=cls,
                caller=caller,
                dataplane=dataplane,
                prompt_bytes=size,
                opening=OPENINGS[opens],
            )
        )

    @rule(
        run=st.sampled_from(RUNS),
        caller=st.sampled_from(CALLERS),
        batch=st.booleans(),
        model=st.sampled_from(["m1", "m2"]),
        dataplane=st.sampled_from(DATAPLANES),
        stale=st.booleans(),
    )
    def place_locally(
        self, run: str, caller: str, batch: bool, model: str, dataplane: str, stale: bool
    ) -> None:
        """A dataplane places a turn itself: on what is open now, or on what it heard before."""
        if stale:
            candidates = [r for r in self.heard_open if model in REPLICAS[r]]
        else:
            candidates = [r.id for r in open_replicas(self.state) if model in r.models]
            self.heard_open = tuple(r.id for r in open_replicas(self.state))
        known = self.state.runs.get(run)
        if known is not None and known.replica:
            if known.replica not in candidates:
                return  # its own run, last elsewhere: the dataplane asks instead
            target = known.replica
        elif candidates:
            target = min(candidates, key=lambda r: (self.state.replicas[r].in_flight, r))
        else:
            return
        before = self.state
        self.turn_no += 1
        turn_id = f"t{self.turn_no}"
        self.step(
            Admit(
                at=self.now,
                turn_id=turn_id,
                run_id=run,
                model=model,
                service_class=ServiceClass.BATCH if batch else ServiceClass.INTERACTIVE,
                caller=caller,
                dataplane=dataplane,
                placed_on=target,
            )
        )
        turn = self.state.turns[turn_id]
        assert turn.replica == target, "a reported placement was not recorded where it went"
        if not stale:
            assert self.state.replicas[target].cap is None
            if known is not None and known.pinned:
                assert before.replicas[known.replica].healthy

    @rule(run=st.sampled_from(RUNS), caller=st.sampled_from(CALLERS))
    def admit_interactive(self, run: str, caller: str) -> None:
        """A second admit rule: contention (several callers held at once) comes sooner."""
        self.admit(run=run, caller=caller, batch=False, model="m1", dt=0.0, dataplane="dp1")

    @precondition(lambda self: bool(self.state.turns))
    @rule(data=st.data(), first=st.booleans())
    def stamp(self, data: st.DataObject, first: bool) -> None:
        """The engine request of a turn started, or sent its first token."""
        turn_id = data.draw(st.sampled_from(sorted(self.state.turns)))
        self.now += 0.1
        kind = FirstToken if first else TurnStarted
        self.step(kind(at=self.now, turn_id=turn_id))

    @precondition(lambda self: bool(self.state.turns))
    @rule(
        data=st.data(),
        tool_calls=st.booleans(),
        how=st.sampled_from(["ok", "ok", "fail", "gone"]),
        prompt=st.sampled_from([0, 200, 700, 1500]),
        cached=st.sampled_from([0, 100]),
    )
    def end_turn(
        self, data: st.DataObject, tool_calls: bool, how: str, prompt: int, cached: int
    ) -> None:
        turn_id = data.draw(st.sampled_from(sorted(self.state.turns)))
        self.now += 0.5
        event: Event
        if how == "ok":
            event = TurnFinished(
                at=self.now,
                turn_id=turn_id,
                tool_calls=tool_calls,
                prompt_tokens=prompt,
                completion_tokens=20 if prompt else 0,
                cached_tokens=min(cached, prompt),
            )
        elif how == "fail":
            event = TurnFailed(at=self.now, turn_id=turn_id)
        else:
            event = TurnAbandoned(at=self.now, turn_id=turn_id)
        self.step(event)

    @precondition(lambda self: bool(self.state.held))
    @rule(data=st.data())
    def abandon_held(self, data: st.DataObject) -> None:
        turn_id = data.draw(st.sampled_from(sorted(self.state.held)))
        self.step(TurnAbandoned(at=self.now, turn_id=turn_id))

    @rule(
        replica=st.sampled_from(sorted(REPLICAS)),
        healthy=st.booleans(),
        running=st.sampled_from([None, 1, 2, 2, 3]),
        waiting=st.sampled_from([None, 0, 1, 1, 2]),
        kv_used=st.sampled_from([None, 100, 1900]),
    )
    def probe(
        self,
        replica: str,
        healthy: bool,
        running: int | None,
        waiting: int | None,
        kv_used: int | None,
    ) -> None:
        before = self.state.replicas[replica]
        old_cap = before.cap
        self.step(
            ProbeResult(
                at=self.now,
                replica_id=replica,
                healthy=healthy,
                running=running,
                waiting=waiting,
                kv_total=3000 if replica in KV and waiting is not None else None,
                kv_used=kv_used if waiting is not None else None,
                max_running=3 if replica == "c" else None,
            )
        )
        after = self.state.replicas[replica]
        cap = after.cap
        floor = max(running or 0, 1)
        if replica in KV:
            assert after.kv_tokens == KV[replica], "the file's KV pool gave way to the engine's"
            full = (running or 0) >= 3 or before.in_flight >= 3
            expected = 3 if waiting is not None and full else None
            assert cap == expected, "a batching engine capped short of the most it runs"
            used = kv_used if waiting is not None else None
            if waiting:
                assert after.kv_bound == (used is not None and used >= 0.9 * KV[replica])
            return
        if waiting is None or (waiting == 0 and (old_cap is None or not running)):
            assert cap is None, "no queue reported, or an idle engine, keeps a cap"
        elif old_cap is None:
            assert cap == floor, "a newly queueing engine is not capped at what it runs"
        elif waiting:
            assert cap is not None and cap <= max(floor, old_cap), "a queue raised the cap"
            if not before.engine_waiting:
                assert cap == old_cap, "a queue seen once moved the cap"
            else:
                assert cap >= floor, "a queueing engine capped below what it runs"
        else:
            assert cap is not None and old_cap <= cap <= old_cap + 1, "cap moved by more than one"
            assert (cap > old_cap) == (before.in_flight >= old_cap), "full cap without a queue"

    @rule(run=st.sampled_from(RUNS))
    def end_run(self, run: str) -> None:
        self.step(RunEnded(at=self.now, run_id=run))

    @rule(dt=st.sampled_from([1.0, 31.0, 700.0, 2000.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.step(Tick(at=self.now))
        for dp, since in list(self.gone_since.items()):
            if self.now - since >= DATAPLANE_GRACE_S:
                assert not any(
                    t.dataplane == dp and t.placed_at < self.now for t in self.state.turns.values()
                ), f"{dp} gone past its grace still has turns in flight"
                del self.gone_since[dp]

    @rule(dataplane=st.sampled_from(DATAPLANES), connect=st.booleans())
    def link(self, dataplane: str, connect: bool) -> None:
        if connect:
            self.step(DataplaneConnected(at=self.now, dataplane=dataplane))
            self.gone_since.pop(dataplane, None)
        else:
            self.step(DataplaneDisconnected(at=self.now, dataplane=dataplane))
            link = self.state.dataplanes.get(dataplane)
            if link is not None and link.gone_since is not None:
                self.gone_since.setdefault(dataplane, link.gone_since)

    @rule(dataplane=st.sampled_from(DATAPLANES), data=st.data())
    def resync(self, dataplane: str, data: st.DataObject) -> None:
        """The dataplane reports its truth, which may have lost some turns meanwhile."""
        mine = sorted(
            (t for t in self.state.turns.values() if t.dataplane == dataplane), key=lambda t: t.id
        )
        kept = [t for t in mine if data.draw(st.booleans())]
        turns = tuple(
            TurnSnapshot(
                turn_id=t.id,
                run_id=t.run_id,
                replica=t.replica,
                model=t.model,
                service_class=t.service_class,
                caller=t.caller,
            )
            for t in kept
        )
        runs = tuple(
            RunSnapshot(
                run_id=r.id,
                replica=r.replica,
                phase=r.phase,
                service_class=r.service_class,
                caller=r.caller,
            )
            for r in sorted(self.state.runs.values(), key=lambda r: r.id)
            if data.draw(st.booleans())
        )
        actions = self.step(Resync(at=self.now, dataplane=dataplane, runs=runs, turns=turns))
        self.gone_since.pop(dataplane, None)
        placed_now = {a.turn_id for a in actions if isinstance(a, Place)}
        mine_after = {t.id for t in self.state.turns.values() if t.dataplane == dataplane}
        assert mine_after - placed_now == {t.turn_id for t in turns}
        for snap in runs:
            run = self.state.runs.get(snap.run_id)
            if run is None or run.turns_in_flight:
                continue  # a held turn of it was placed as the resync drained
            assert (run.replica, run.service_class, run.caller) == (
                snap.replica,
                snap.service_class,
                snap.caller,
            )
            assert run.phase is (Phase.IDLE if snap.phase is Phase.GENERATING else snap.phase)

    @invariant()
    def no_held_turn_could_be_placed(self) -> None:
        for turn in self.state.held.values():
            assert choose_replica(self.state, turn) is None, f"{turn.id} left waiting"

    @invariant()
    def counters_and_indexes_match_turns_and_runs(self) -> None:
        s = self.state
        per_replica = Counter(t.replica for t in s.turns.values())
        interactive = Counter(
            t.replica for t in s.turns.values() if t.service_class is ServiceClass.INTERACTIVE
        )
        per_caller = Counter(t.caller for t in s.turns.values() if not t.single_pass)
        paused = Counter(
            r.replica
            for r in s.runs.values()
            if s.rules.headroom
            and r.phase is Phase.TOOL_PAUSED
            and r.service_class is ServiceClass.INTERACTIVE
        )
        slotted = [(t.replica, t.slot) for t in s.turns.values() if t.slot >= 0]
        assert len(slotted) == len(set(slotted)), "two turns in one engine slot"
        for rid, replica in s.replicas.items():
            assert replica.in_flight == per_replica[rid]
            assert replica.interactive_in_flight == interactive[rid]
            assert replica.paused_interactive == paused[rid]
            assert replica.busy_slots == {slot for r, slot in slotted if r == rid}
            assert len(replica.slot_runs) == replica.slots == SLOTS.get(rid, 0)
            assert len(replica.saves) == SAVES.get(rid, 0)
            kept = [run for run in replica.saves if run]
            assert len(kept) == len(set(kept)), "one run's context in two files"
            assert replica.capacity == limit_of(replica.cap, replica.slots, replica.unread)
        assert dict(s.caller_in_flight.items()) == dict(per_caller)
        per_run = Counter(t.run_id for t in s.turns.values())
        for run in s.runs.values():
            assert run.turns_in_flight == per_run[run.id]
            assert (run.phase is Phase.GENERATING) == (run.turns_in_flight > 0)
        oldest: dict[tuple[object, ...], int] = {}
        for held in s.held.values():
            key = (held.bucket, held.service_class, held.caller)
            oldest[key] = min(oldest.get(key, held.seq), held.seq)
        heads = {
            (b, c, caller): seq
            for (b, c), callers in s.heads.items()
            for caller, (seq, _) in callers.items()
        }
        assert heads == oldest, "queue heads are not each caller's oldest held turn"
        check_residency(s)
        check_rebuilds(s, self.now)
        for held in s.held.values():
            assert held.bucket == bucket_of(
                s, held.run_id, held.model, held.single_pass, held.overdue
            )
            assert held.id in s.held_by_run[held.run_id]


CoreMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
TestCoreInvariants = CoreMachine.TestCase
