"""Wire messages round-trip through JSON, and bad ones are refused naming the field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopsmgr.protocol import (
    PROTOCOL_VERSION,
    FinishedAttempt,
    Heartbeat,
    HeartbeatReply,
    Progress,
    RunningAttempt,
    WireError,
    parse_heartbeat,
    parse_heartbeat_reply,
)

ids = st.from_regex(r"[A-Za-z0-9_.-]{1,20}", fullmatch=True)
finite = st.floats(min_value=0, max_value=1e9, allow_nan=False)
progress = st.builds(
    Progress,
    st.integers(0, 10**9),
    finite,
    finite,
    finite,
    finite,
    finite,
    st.sampled_from(["run", "profile"]),
)


@settings(max_examples=60, deadline=None)
@given(
    node=ids,
    gpus=st.integers(0, 64),
    running=st.lists(st.builds(RunningAttempt, ids, ids, st.none() | progress), max_size=4),
    finished=st.lists(
        st.builds(
            FinishedAttempt,
            ids,
            ids,
            st.none() | st.integers(-255, 255),
            st.none() | st.integers(0, 64),
            st.booleans(),
            st.none() | st.dictionaries(st.from_regex(r"[a-z_]{1,10}", fullmatch=True), finite, max_size=5),
            st.none() | progress,
            # what agents send: valid Unicode (they read logs with errors="replace"; the schema refuses
            # a lone surrogate, tests/fuzz)
            st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=50),
        ),
        max_size=3,
    ),
)
def test_heartbeat_round_trips_through_json(node: str, gpus: int, running: list, finished: list) -> None:
    beat = Heartbeat(
        node=node,
        gpu_type="v100",
        gpus=gpus,
        device_mode="emulated",
        workdir="/w",
        calibration={"compute_factor": 1.5},
        calibration_source="emulated",
        running=tuple(running),
        finished=tuple(finished),
    )
    assert parse_heartbeat(json.loads(json.dumps(beat.to_json()))) == beat


def test_reply_round_trips() -> None:
    reply = HeartbeatReply(epoch=3, interval_s=5.0, ack=("a-1",), stop=("a-2",), calibrate=True)
    assert parse_heartbeat_reply(json.loads(json.dumps(reply.to_json()))) == reply


BASE = {"node": "n1", "gpu_type": "v100", "gpus": 2, "device_mode": "emulated", "workdir": "/w"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"extra": 1}, "extra"),
        ({"gpus": -1}, "gpus"),
        ({"gpus": True}, "gpus"),
        ({"node": "a/b"}, "node"),
        ({"device_mode": "magic"}, "device_mode"),
        ({"running": [{"job": "j"}]}, "running[0].attempt"),
        ({"running": [{"attempt": "../x", "job": "j"}]}, "running[0].attempt"),
        ({"finished": [{"attempt": "a", "job": "j"}]}, "finished[0].code"),
        ({"calibration": {"compute_factor": 0}}, "calibration.compute_factor"),
        ({"calibration": {"warp": 1.0}}, "calibration.warp"),
        ({"running": {"a": 1}}, "running"),
    ],
)
def test_bad_heartbeats_name_the_field(change: dict, field: str) -> None:
    with pytest.raises(WireError) as info:
        parse_heartbeat({**BASE, **change})
    assert info.value.field == field


def test_missing_field_and_other_protocol() -> None:
    with pytest.raises(WireError) as info:
        parse_heartbeat({k: v for k, v in BASE.items() if k != "workdir"})
    assert info.value.field == "workdir"
    with pytest.raises(WireError) as info:
        parse_heartbeat({**BASE, "protocol": PROTOCOL_VERSION + 1})
    assert info.value.field == "protocol" and str(PROTOCOL_VERSION + 1) in info.value.message


def test_nul_bytes_in_a_log_tail_are_replaced_not_refused() -> None:
    beat = parse_heartbeat(
        {**BASE, "finished": [{"attempt": "a", "job": "j", "code": 1, "log_tail": "x\x00y"}]}
    )
    assert beat.finished[0].log_tail == "x\ufffdy"


def test_a_log_tail_the_schema_allows_fits_the_body_limit_and_a_longer_one_is_refused() -> None:
    from hopsmgr.master.api import MAX_BODY

    def beat(tail: str) -> dict[str, object]:
        return {**BASE, "finished": [{"attempt": "a", "job": "j", "code": 1, "log_tail": tail}]}

    longest = "\x01" * (1 << 13)  # the costliest character in JSON: 6 bytes
    assert parse_heartbeat(beat(longest)).finished[0].log_tail == longest
    assert len(json.dumps(beat(longest)).encode()) < MAX_BODY  # a 400 for one more, never a 413
    with pytest.raises(WireError) as info:
        parse_heartbeat(beat("x" * ((1 << 13) + 1)))
    assert info.value.field == "finished[0].log_tail"


def test_new_tokens_never_start_like_a_command_line_option() -> None:
    from hopsmgr.master.tokens import new_token

    tokens = {new_token() for _ in range(2000)}  # about 31 of 2000 urlsafe tokens start with "-"
    assert len(tokens) == 2000 and not [t for t in tokens if t.startswith("-")]
    assert all(len(t) >= 43 for t in tokens)
