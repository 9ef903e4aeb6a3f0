"""The SSE observer reads facts from a stream cut at any byte; no sockets, no event loop."""

from __future__ import annotations

import itertools
import json

from hypothesis import given
from hypothesis import strategies as st

from luftpause.dataplane.reply import Usage
from luftpause.dataplane.sse import LineDecoder, SseObserver
from tests.dataplane.fakes import TEXT_STREAM, TOOL_STREAM, delta_chunk, sse, usage_chunk


def feed_in_pieces(observer: SseObserver, data: bytes, cuts: list[int]) -> list[int]:
    """Feed `data` split at `cuts`; return the indexes of the pieces that said "first token"."""
    bounds = [0, *sorted(set(cuts)), len(data)]
    hits = [i for i, (a, b) in enumerate(itertools.pairwise(bounds)) if observer.feed(data[a:b])]
    if observer.flush():
        hits.append(len(bounds))
    return hits


def test_line_decoder_joins_lines_split_across_chunks() -> None:
    decoder = LineDecoder()
    assert decoder.feed(b"data: a") == []
    assert decoder.feed(b"bc\ndata:") == [b"data: abc"]
    assert decoder.feed(b" d\n\n") == [b"data: d", b""]
    assert decoder.flush() == []


def test_line_decoder_treats_crlf_split_between_chunks_as_one_line_end() -> None:
    decoder = LineDecoder()
    assert decoder.feed(b"data: a\r") == [b"data: a"]
    assert decoder.feed(b"\ndata: b\r\n\r\n") == [b"data: b", b""]


def test_line_decoder_accepts_bare_cr_line_ends() -> None:
    decoder = LineDecoder()
    assert decoder.feed(b"data: a\rdata: b\r") == [b"data: a", b"data: b"]
    assert decoder.feed(b"x") == []
    assert decoder.flush() == [b"x"]


@given(st.lists(st.integers(min_value=0, max_value=4000), max_size=30))
def test_line_decoder_gives_the_same_lines_however_the_bytes_are_cut(cuts: list[int]) -> None:
    data = b"".join(TOOL_STREAM).replace(b"\n", b"\r\n")
    decoder = LineDecoder()
    bounds = [0, *sorted(c for c in set(cuts) if c < len(data)), len(data)]
    lines = [ln for a, b in itertools.pairwise(bounds) for ln in decoder.feed(data[a:b])]
    lines += decoder.flush()
    assert lines == data.replace(b"\r\n", b"\n").split(b"\n")[:-1]


def test_text_stream_reports_first_token_usage_and_stop() -> None:
    observer = SseObserver()
    hits = [i for i, chunk in enumerate(TEXT_STREAM) if observer.feed(chunk)]
    summary = observer.summary()
    assert hits == [1]  # the role chunk with empty content is not a token
    assert observer.done
    assert summary.finish_reason == "stop"
    assert summary.usage == Usage(prompt_tokens=12, completion_tokens=2, cached_tokens=8)
    assert not summary.tool_calls and summary.tool_call_ids == ()


@given(st.lists(st.integers(min_value=1, max_value=3000), max_size=40))
def test_tool_call_stream_gives_the_same_facts_however_the_bytes_are_cut(cuts: list[int]) -> None:
    data = b"".join(TOOL_STREAM)
    observer = SseObserver()
    hits = feed_in_pieces(observer, data, [c for c in cuts if c < len(data)])
    summary = observer.summary()
    assert len(hits) == 1
    assert summary.tool_calls and summary.tool_call_ids == ("call_abc",)
    assert summary.finish_reason == "tool_calls"
    assert summary.usage == Usage(prompt_tokens=20, completion_tokens=7, cached_tokens=0)
    assert observer.done


@given(st.lists(st.integers(min_value=1, max_value=3000), max_size=40))
def test_text_stream_gives_the_same_facts_however_the_bytes_are_cut(cuts: list[int]) -> None:
    """Whole content chunks after the first token are passed over; cut ones are not lost."""
    data = b"".join(TEXT_STREAM)
    observer = SseObserver()
    hits = feed_in_pieces(observer, data, [c for c in cuts if c < len(data)])
    summary = observer.summary()
    assert len(hits) == 1
    assert summary.finish_reason == "stop"
    assert summary.usage == Usage(prompt_tokens=12, completion_tokens=2, cached_tokens=8)
    assert observer.done


def test_content_chunks_after_the_first_token_leave_no_line_behind() -> None:
    observer = SseObserver()
    for chunk in TEXT_STREAM[:2]:
        observer.feed(chunk)
    assert observer.first_token
    (more,) = sse(delta_chunk({"content": "more"}), done=False)
    (last,) = sse(delta_chunk({}, "length"), done=False)
    assert not observer.feed(more)
    assert not observer.feed(last)
    assert observer.summary().finish_reason == "length"
    assert not observer.done


def test_crlf_stream_is_read_like_lf() -> None:
    observer = SseObserver()
    for chunk in TEXT_STREAM:
        observer.feed(chunk.replace(b"\n", b"\r\n"))
    assert observer.first_token and observer.done
    assert observer.summary().finish_reason == "stop"


def test_parallel_tool_calls_keep_every_id_once() -> None:
    calls = [
        {"index": i, "id": f"call_{i}", "type": "function", "function": {"name": "f"}}
        for i in range(3)
    ]
    stream = sse(
        delta_chunk({"tool_calls": calls[:2]}),
        delta_chunk({"tool_calls": [calls[2], {"index": 0, "function": {"arguments": "{}"}}]}),
        delta_chunk({}, "tool_calls"),
    )
    observer = SseObserver()
    for chunk in stream:
        observer.feed(chunk)
    assert observer.summary().tool_call_ids == ("call_0", "call_1", "call_2")


def test_null_usage_and_finish_reason_on_content_chunks_are_not_facts() -> None:
    chunk = delta_chunk({"content": "x"})
    chunk["usage"] = None
    observer = SseObserver()
    for line in sse(chunk, chunk, done=False):
        observer.feed(line)
    assert observer.summary().usage is None and observer.summary().finish_reason == ""


def test_key_names_inside_content_do_not_confuse_the_observer() -> None:
    tricky = delta_chunk({"content": 'say "finish_reason": "usage" please'})
    observer = SseObserver()
    for line in sse(delta_chunk({"content": "a"}), tricky, done=False):
        observer.feed(line)
    assert observer.summary().finish_reason == ""


def test_reasoning_content_counts_as_the_first_token() -> None:
    observer = SseObserver()
    assert observer.feed(sse(delta_chunk({"reasoning_content": "hmm"}), done=False)[0])


def test_spaced_json_and_usage_at_top_level_are_read() -> None:
    body = json.dumps(usage_chunk(5, 1, 0), indent=None, separators=(", ", " : "))
    observer = SseObserver()
    observer.feed(b"data:" + body.encode() + b"\n\n")
    assert observer.summary().usage == Usage(prompt_tokens=5, completion_tokens=1)


def test_comments_events_and_garbage_lines_are_ignored() -> None:
    observer = SseObserver()
    assert not observer.feed(b": keep-alive\n\nevent: ping\ndata: {not json\n\n")
    assert observer.summary().finish_reason == "" and not observer.done


def test_unterminated_last_line_is_read_on_flush() -> None:
    observer = SseObserver()
    observer.feed(b"data: " + json.dumps(delta_chunk({}, "length")).encode())
    assert observer.summary().finish_reason == ""
    observer.flush()
    assert observer.summary().finish_reason == "length"
