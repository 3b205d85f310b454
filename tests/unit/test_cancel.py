"""rlgen.engines.cancel.next_event, which both engines' streams wait in: items come through, a cancelled call is
seen within a poll, and a stream that sends nothing times out."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from rlgen.engines.cancel import CANCELLED, POLL_S, next_event, run


def test_items_come_through_in_order():
    events: queue.Queue = queue.Queue()
    for item in ("a", "b", None):
        events.put(item)
    assert [next_event(events), next_event(events), next_event(events)] == ["a", "b", None]


def test_a_cancelled_event_or_call_is_seen_within_a_poll():
    events: queue.Queue = queue.Queue()
    event = threading.Event()
    threading.Timer(0.1, event.set).start()
    t0 = time.monotonic()
    assert next_event(events, event) is CANCELLED
    assert time.monotonic() - t0 < 0.1 + 2 * POLL_S
    # the thread's own call, cancelled through run()'s event, without passing it
    own = threading.Event()
    own.set()
    assert run(own, next_event, events) is CANCELLED
    events.put("late")  # an item already there comes first, cancelled or not
    assert next_event(events, event) == "late"


def test_a_stream_that_sends_nothing_times_out():
    with pytest.raises(TimeoutError, match="nothing came for 0 s"):
        next_event(queue.Queue(), timeout_s=0.3)
