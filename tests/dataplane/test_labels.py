"""The decide forms and label scoring: pure, no event loop."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from luftpause.dataplane.errors import BadRequest
from luftpause.dataplane.labels import (
    ClassifyRequest,
    LabelsRequest,
    first_token_alternatives,
    label_prompt,
    labels_chat_body,
    parse_decide_body,
    score_labels,
)


def body(**doc: Any) -> bytes:
    return json.dumps(doc).encode()


def test_input_without_labels_is_the_classify_form() -> None:
    assert parse_decide_body(body(model="clf", input="hi")) == ClassifyRequest(model="clf")
    assert parse_decide_body(body(model="clf", input=["a", "b"])) == ClassifyRequest(model="clf")


def test_input_with_labels_is_the_labels_form() -> None:
    ask = parse_decide_body(body(model="m", input="text", labels=["urgent", "lookup"]))
    assert ask == LabelsRequest(model="m", text="text", labels=("urgent", "lookup"))


@pytest.mark.parametrize(
    "doc",
    [
        {"input": "x"},
        {"model": 3, "input": "x"},
        {"model": "", "input": "x"},
        {"model": "m"},
        {"model": "m", "input": 5},
        {"model": "m", "input": []},
        {"model": "m", "input": ["a", 1]},
        {"model": "m", "input": "x", "labels": ["only-one"]},
        {"model": "m", "input": "x", "labels": [f"l{i}" for i in range(21)]},
        {"model": "m", "input": "x", "labels": ["a", ""]},
        {"model": "m", "input": "x", "labels": ["a", "  "]},
        {"model": "m", "input": "x", "labels": ["a", 2]},
        {"model": "m", "input": "x", "labels": ["Yes", "yes "]},
        {"model": "m", "input": "x", "labels": "a,b"},
        {"model": "m", "input": ["x"], "labels": ["a", "b"]},
        {"model": "m", "input": "  ", "labels": ["a", "b"]},
    ],
)
def test_malformed_decide_bodies_are_bad_requests(doc: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        parse_decide_body(body(**doc))


def test_non_objects_and_broken_json_are_bad_requests() -> None:
    for raw in (b"[]", b"null", b"{", b"\xff", b"[" * 100_000):
        with pytest.raises(BadRequest):
            parse_decide_body(raw)


def test_twenty_labels_are_allowed() -> None:
    labels = [f"l{i}" for i in range(20)]
    ask = parse_decide_body(body(model="m", input="x", labels=labels))
    assert isinstance(ask, LabelsRequest) and len(ask.labels) == 20


def test_labels_turn_asks_for_one_token_with_twenty_alternatives() -> None:
    ask = LabelsRequest(model="m", text="the pager is ringing", labels=("urgent", "lookup"))
    doc = json.loads(labels_chat_body(ask))
    assert doc["model"] == "m" and doc["max_tokens"] == 1 and doc["stream"] is False
    assert doc["logprobs"] is True and doc["top_logprobs"] == 20
    assert doc["messages"][-1] == {"role": "user", "content": label_prompt(ask.text, ask.labels)}
    assert "one of: urgent, lookup." in doc["messages"][-1]["content"]


def completion(first: dict[str, Any]) -> dict[str, Any]:
    return {"choices": [{"index": 0, "logprobs": {"content": [first]}}]}


def test_alternatives_are_the_first_tokens_top_logprobs_and_the_chosen_token() -> None:
    first = {
        "token": "urgent",
        "logprob": -0.1,
        "top_logprobs": [{"token": "urgent", "logprob": -0.1}, {"token": "look", "logprob": -2.5}],
    }
    assert first_token_alternatives(completion(first)) == [("urgent", -0.1), ("look", -2.5)]
    alone = {"token": "ok", "logprob": -0.2, "top_logprobs": []}
    assert first_token_alternatives(completion(alone)) == [("ok", -0.2)]


@pytest.mark.parametrize(
    "reply",
    [
        {},
        {"choices": []},
        {"choices": [{"logprobs": None}]},
        {"choices": [{"logprobs": {"content": []}}]},
        {"choices": [{"logprobs": {"content": ["x"]}}]},
        completion({"token": 3, "logprob": "x", "top_logprobs": [{"token": "a"}]}),
        [],
    ],
)
def test_replies_without_usable_logprobs_have_no_alternatives(reply: Any) -> None:
    assert first_token_alternatives(reply) is None


def test_best_label_takes_most_of_the_probability() -> None:
    scores = score_labels(
        ["urgent", "lookup", "chitchat"], [("urgent", math.log(0.6)), ("lookup", math.log(0.2))]
    )
    assert scores.label == "urgent"
    assert scores.probabilities == pytest.approx({"urgent": 0.75, "lookup": 0.25})
    assert scores.unscored == ("chitchat",)


def test_tokens_match_labels_ignoring_case_space_and_punctuation_and_add_up() -> None:
    alternatives = [
        (" Urgent", math.log(0.2)),
        ("urg", math.log(0.1)),
        ('"lookup', math.log(0.3)),
        ("Lookup.", math.log(0.1)),
        ("lookups", math.log(0.2)),  # longer than the label: not a prefix of it
    ]
    scores = score_labels(["urgent", "lookup"], alternatives)
    assert scores.probabilities == pytest.approx({"urgent": 0.3 / 0.7, "lookup": 0.4 / 0.7})
    assert scores.label == "lookup"


def test_a_token_that_spells_a_label_whole_goes_to_that_label() -> None:
    scores = score_labels(["no", "not sure"], [("No", math.log(0.5)), ("not", math.log(0.5))])
    assert scores.probabilities == pytest.approx({"no": 0.5, "not sure": 0.5})


def test_a_prefix_of_several_labels_is_shared_between_them() -> None:
    scores = score_labels(["urgent", "urgency", "lookup"], [("urg", math.log(0.4))])
    assert scores.probabilities == pytest.approx({"urgent": 0.5, "urgency": 0.5})
    assert scores.label == "urgent" and scores.unscored == ("lookup",)


def test_labels_match_by_their_first_word_prefix() -> None:
    scores = score_labels(["on hold", "done"], [("On", math.log(0.9)), (" done", math.log(0.05))])
    assert scores.label == "on hold"


def test_no_matching_token_leaves_every_label_unscored() -> None:
    scores = score_labels(["yes", "no"], [("maybe", -0.1), ("", -1.0), ("  ", -2.0)])
    assert scores.label is None and scores.probabilities == {}
    assert scores.unscored == ("yes", "no")


def test_a_tie_goes_to_the_first_label() -> None:
    scores = score_labels(["b", "a"], [("a", -1.0), ("b", -1.0)])
    assert scores.label == "b"


tokens = st.text(alphabet="abcAB .\"'", max_size=6)
logprobs = st.floats(min_value=-30.0, max_value=0.0)


@given(
    labels=st.lists(
        st.text(alphabet="abcAB ", min_size=1, max_size=6).filter(lambda s: s.strip()),
        min_size=2,
        max_size=20,
        unique_by=lambda s: s.strip().lower(),
    ),
    alternatives=st.lists(st.tuples(tokens, logprobs), max_size=20),
)
def test_scores_are_a_distribution_over_the_scored_labels(
    labels: list[str], alternatives: list[tuple[str, float]]
) -> None:
    """Scored and unscored labels partition the labels; probabilities sum to 1; the label
    is the most probable one."""
    scores = score_labels(labels, alternatives)
    assert set(scores.probabilities) | set(scores.unscored) == set(labels)
    assert not set(scores.probabilities) & set(scores.unscored)
    if scores.label is None:
        assert not scores.probabilities
    else:
        assert sum(scores.probabilities.values()) == pytest.approx(1.0)
        assert all(0.0 < p <= 1.0 for p in scores.probabilities.values())
        assert scores.probabilities[scores.label] == max(scores.probabilities.values())
