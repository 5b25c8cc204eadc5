"""Unit tests of hopsmgr.core.lifecycle: the transition table, `transition`, and the Mermaid diagram."""

from __future__ import annotations

import itertools

import pytest

from hopsmgr.core.lifecycle import (
    LIVE,
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    JobState,
    can_transition,
    mermaid_diagram,
    transition,
)

S = JobState
ALL_PAIRS = list(itertools.product(JobState, JobState))
EDGES = [(src, dst) for src in JobState for dst in TRANSITIONS[src]]
NON_EDGES = [(src, dst) for src, dst in ALL_PAIRS if dst not in TRANSITIONS[src]]


def test_table_covers_every_state_and_names_only_states() -> None:
    assert set(TRANSITIONS) == set(JobState)
    for targets in TRANSITIONS.values():
        assert targets <= set(JobState)


def test_pairs_split_into_edges_and_non_edges() -> None:
    assert len(ALL_PAIRS) == 81
    assert len(EDGES) + len(NON_EDGES) == 81
    # The documented table, edge by edge (a change to the table must be deliberate).
    assert set(EDGES) == {
        (S.PENDING, S.PROFILING),
        (S.PENDING, S.QUEUED),
        (S.PENDING, S.FAILED),
        (S.PENDING, S.CANCELLED),
        (S.PROFILING, S.QUEUED),
        (S.PROFILING, S.FAILED),
        (S.PROFILING, S.CANCELLED),
        (S.QUEUED, S.LAUNCHING),
        (S.QUEUED, S.FAILED),
        (S.QUEUED, S.CANCELLED),
        (S.LAUNCHING, S.RUNNING),
        (S.LAUNCHING, S.QUEUED),
        (S.LAUNCHING, S.FAILED),
        (S.LAUNCHING, S.CANCELLED),
        (S.RUNNING, S.CHECKPOINTING),
        (S.RUNNING, S.QUEUED),
        (S.RUNNING, S.COMPLETED),
        (S.RUNNING, S.FAILED),
        (S.RUNNING, S.CANCELLED),
        (S.CHECKPOINTING, S.QUEUED),
        (S.CHECKPOINTING, S.COMPLETED),
        (S.CHECKPOINTING, S.FAILED),
        (S.CHECKPOINTING, S.CANCELLED),
    }


@pytest.mark.parametrize(("src", "dst"), EDGES, ids=[f"{a.value}->{b.value}" for a, b in EDGES])
def test_every_edge_is_accepted(src: JobState, dst: JobState) -> None:
    assert transition(src, dst) is dst
    assert can_transition(src, dst)


@pytest.mark.parametrize(("src", "dst"), NON_EDGES, ids=[f"{a.value}->{b.value}" for a, b in NON_EDGES])
def test_every_non_edge_raises(src: JobState, dst: JobState) -> None:
    assert not can_transition(src, dst)
    with pytest.raises(IllegalTransition) as info:
        transition(src, dst)
    assert info.value.current is src
    assert info.value.new is dst
    assert f"{src.value} -> {dst.value}" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_no_self_loops() -> None:
    for state in JobState:
        with pytest.raises(IllegalTransition):
            transition(state, state)


def test_terminal_and_live_partition_the_states() -> None:
    assert {S.COMPLETED, S.FAILED, S.CANCELLED} == TERMINAL
    assert TERMINAL.isdisjoint(LIVE)
    assert set(JobState) == TERMINAL | LIVE


@pytest.mark.parametrize("state", [s for s in JobState if s in TERMINAL])
def test_terminal_states_have_no_exits(state: JobState) -> None:
    assert TRANSITIONS[state] == frozenset()
    for dst in JobState:
        with pytest.raises(IllegalTransition):
            transition(state, dst)


@pytest.mark.parametrize("state", [s for s in JobState if s in LIVE])
def test_cancelled_and_failed_reachable_from_every_live_state(state: JobState) -> None:
    assert transition(state, S.CANCELLED) is S.CANCELLED
    assert transition(state, S.FAILED) is S.FAILED


def test_every_live_state_can_reach_a_terminal_state_and_is_reachable_from_pending() -> None:
    reachable = {S.PENDING}
    frontier = [S.PENDING]
    while frontier:
        src = frontier.pop()
        for dst in TRANSITIONS[src]:
            if dst not in reachable:
                reachable.add(dst)
                frontier.append(dst)
    assert reachable == set(JobState)
    assert S.COMPLETED in TRANSITIONS[S.RUNNING]


def test_mermaid_diagram_has_every_edge_and_nothing_else() -> None:
    text = mermaid_diagram()
    lines = text.splitlines()
    assert lines[0] == "stateDiagram-v2"
    assert text.endswith("\n")
    assert "    [*] --> PENDING" in lines
    arrows = {tuple(line.strip().split(" --> ")) for line in lines[1:]}
    for src, dst in EDGES:
        assert (src.value, dst.value) in arrows
    for state in TERMINAL:
        assert (state.value, "[*]") in arrows
    # Nothing beyond the table: the edges, the start arrow and one end arrow per terminal state.
    assert len(arrows) == len(EDGES) + 1 + len(TERMINAL)
    assert len(lines) - 1 == len(arrows)
    for src, dst in NON_EDGES:
        assert (src.value, dst.value) not in arrows
