"""`POST /v1/decide`: its two request forms, the label prompt, and label scoring.

Pure module: no I/O.

- Without `labels` the request is vLLM's `/classify` shape (`{"model", "input": str | [str]}`)
  for a single-pass replica; its body goes to the engine unchanged.
- With 2 to 20 `labels` it is one `max_tokens: 1` chat turn on a generative replica, asking for
  one of the labels with the first token's `top_logprobs`. `score_labels` turns those into a
  probability per label: a token counts for a label when, ignoring case, surrounding space and
  punctuation, it is a prefix of the label ("Urg" and " urgent" both count for "urgent"); the
  probabilities of all tokens that count for a label add up. A token that is a prefix of several
  labels goes to the one it spells out whole, else is shared equally between them. The result is
  normalised over the labels that got any probability; the others are `unscored`.
"""

from __future__ import annotations

import json
import math
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from luftpause.dataplane.errors import BadRequest
from luftpause.dataplane.forwarding import parse_json_object, require_model

MIN_LABELS = 2
MAX_LABELS = 20
TOP_LOGPROBS = 20
# Around a token: whitespace, the SentencePiece / byte-BPE space marks, quotes and punctuation.
_SPACE = string.whitespace + "\u2581\u0120"
_PUNCT = _SPACE + string.punctuation + "\u201c\u201d\u2018\u2019"


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassifyRequest:
    """A `/classify` request for a single-pass replica; its bytes are sent on unchanged."""

    model: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LabelsRequest:
    """Score `labels` for `text` from a generative model's first-token logprobs."""

    model: str
    text: str
    labels: tuple[str, ...]

    def __post_init__(self) -> None:
        check_labels(self.labels)


@dataclass(frozen=True, slots=True, kw_only=True)
class Scores:
    """The best label (None if no label got any probability), normalised probabilities."""

    label: str | None
    probabilities: Mapping[str, float]
    unscored: tuple[str, ...]

    def as_json(self, model: str) -> dict[str, Any]:
        return {
            "label": self.label,
            "probabilities": dict(self.probabilities),
            "unscored": list(self.unscored),
            "model": model,
        }


def _norm_label(label: str) -> str:
    return label.strip().lower()


def check_labels(labels: Sequence[Any]) -> None:
    """`BadRequest` unless 2 to 20 distinct, non-empty strings (case and space ignored)."""
    if not MIN_LABELS <= len(labels) <= MAX_LABELS:
        raise BadRequest(f"'labels' must hold {MIN_LABELS} to {MAX_LABELS} labels")
    if not all(isinstance(x, str) and x.strip() for x in labels):
        raise BadRequest("every label must be a non-empty string")
    if len({_norm_label(x) for x in labels}) != len(labels):
        raise BadRequest("labels must be distinct (ignoring case and surrounding space)")


def parse_decide_body(body: bytes) -> ClassifyRequest | LabelsRequest:
    """Which form of decide the body is; `BadRequest` if it is neither."""
    doc = parse_json_object(body)
    model = require_model(doc)
    text = doc.get("input")
    labels = doc.get("labels")
    if labels is None:
        if isinstance(text, str) or (
            isinstance(text, list) and text and all(isinstance(t, str) for t in text)
        ):
            return ClassifyRequest(model=model)
        raise BadRequest("'input' must be a string or a non-empty list of strings")
    if not isinstance(labels, list):
        raise BadRequest("'labels' must be a list of strings")
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("with 'labels', 'input' must be a non-empty string")
    return LabelsRequest(model=model, text=text, labels=tuple(labels))


def label_prompt(text: str, labels: Sequence[str]) -> str:
    """The user message: the label list first, then the text."""
    return (
        f"Classify the text below. Answer with exactly one of: {', '.join(labels)}.\n"
        "Reply with the label only, nothing else.\n\n"
        f"Text: {text}"
    )


def labels_chat_body(ask: LabelsRequest) -> bytes:
    """The one-token chat completion request that scores `ask`'s labels."""
    body = {
        "model": ask.model,
        "messages": [
            {
                "role": "system",
                "content": "You sort texts into labels. Answer with one label, as written.",
            },
            {"role": "user", "content": label_prompt(ask.text, ask.labels)},
        ],
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": TOP_LOGPROBS,
        "stream": False,
    }
    return json.dumps(body).encode()


def _logprob(entry: Any) -> tuple[str, float] | None:
    if not isinstance(entry, Mapping):
        return None
    token, logprob = entry.get("token"), entry.get("logprob")
    if not isinstance(token, str) or isinstance(logprob, bool):
        return None
    if not isinstance(logprob, int | float) or math.isnan(logprob) or logprob == math.inf:
        return None
    return token, min(float(logprob), 0.0)


def first_token_alternatives(completion: Any) -> list[tuple[str, float]] | None:
    """(token, logprob) of the first generated token and its alternatives, from an OpenAI
    chat completion; None if the reply carries no logprobs."""
    try:
        first = completion["choices"][0]["logprobs"]["content"][0]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(first, Mapping):
        return None
    seen: dict[str, float] = {}
    top = first.get("top_logprobs")
    for entry in [*(top if isinstance(top, list) else []), first]:
        pair = _logprob(entry)
        if pair is not None:
            seen.setdefault(*pair)
    return list(seen.items()) or None


def _token_forms(token: str) -> set[str]:
    forms = {token.strip(_SPACE).lower(), token.strip(_PUNCT).lower()}
    forms.discard("")
    return forms


def _owners(token: str, normed: Sequence[str]) -> list[int]:
    forms = _token_forms(token)
    whole = [i for i, label in enumerate(normed) if label in forms]
    if whole:
        return whole
    return [i for i, label in enumerate(normed) if any(label.startswith(f) for f in forms)]


def score_labels(labels: Sequence[str], alternatives: Iterable[tuple[str, float]]) -> Scores:
    """Each label's share of the first-token probability (see the module docstring)."""
    normed = [_norm_label(x) for x in labels]
    mass = [0.0] * len(labels)
    for token, logprob in alternatives:
        owners = _owners(token, normed)
        for i in owners:
            mass[i] += math.exp(logprob) / len(owners)
    total = sum(mass)
    if total <= 0.0:
        return Scores(label=None, probabilities={}, unscored=tuple(labels))
    probabilities = {x: m / total for x, m in zip(labels, mass, strict=True) if m > 0.0}
    best = max(probabilities, key=lambda x: probabilities[x])
    unscored = tuple(x for x, m in zip(labels, mass, strict=True) if m <= 0.0)
    return Scores(label=best, probabilities=probabilities, unscored=unscored)
