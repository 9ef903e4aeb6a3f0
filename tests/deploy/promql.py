"""The metric names a PromQL expression reads, for checking a dashboard against the services.

Pure module: a tokenizer and one pass over its tokens, no PromQL engine. It knows PromQL's
lexical shape (strings, numbers and durations, identifiers, label matchers in braces, ranges in
brackets) and its grammar only as far as names go: an identifier followed by `(`, or an
aggregation followed by `by` or `without`, is a function or aggregation and must be a known
one; the lists after `by`, `without`, `on`, `ignoring`, `group_left` and `group_right` and the
identifiers inside `{...}` are label names; every other identifier that is not a keyword is a
metric name. Grafana's `$variables` stand for a duration or a value and are read as one.
Unbalanced brackets, an unknown function or a stray character is a `PromQLError`.
"""

from __future__ import annotations

import re

FUNCTIONS = frozenset(
    {
        # aggregations
        "sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk",
        "quantile", "count_values", "limitk", "limit_ratio",
        # functions
        "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max",
        "clamp_min", "day_of_month", "day_of_week", "days_in_month", "delta", "deriv", "exp",
        "floor", "histogram_count", "histogram_sum", "histogram_fraction", "histogram_quantile",
        "holt_winters", "hour", "idelta", "increase", "irate", "label_join", "label_replace",
        "ln", "log2", "log10", "minute", "month", "predict_linear", "rate", "resets", "round",
        "scalar", "sgn", "sort", "sort_desc", "sqrt", "time", "timestamp", "vector", "year",
        "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
        "quantile_over_time", "stddev_over_time", "stdvar_over_time", "last_over_time",
        "present_over_time",
    }
)  # fmt: skip
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan"})
GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<variable>\$\{[A-Za-z_][A-Za-z0-9_:]*\}|\$[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?(?:ms|[smhdwy])?(?:\d+(?:ms|[smhdwy]))*)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=,@:])
  | (?P<open>[({\[])
  | (?P<close>[)}\]])
    """,
    re.VERBOSE,
)
_PAIRS = {")": "(", "}": "{", "]": "["}


class PromQLError(ValueError):
    """The expression is not PromQL this reader accepts."""


def tokens(expr: str) -> list[tuple[str, str]]:
    """(kind, text) of each token, spaces left out."""
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if match is None:
            raise PromQLError(f"unexpected {expr[pos]!r} at {pos} in {expr!r}")
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            out.append((kind, match.group()))
        pos = match.end()
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` selects."""
    toks = tokens(expr)
    names: set[str] = set()
    # Open brackets, each with whether identifiers inside it are label names.
    stack: list[tuple[str, bool]] = []
    label_list = False  # the next ( opens a list of label names
    for i, (kind, text) in enumerate(toks):
        following = toks[i + 1][1] if i + 1 < len(toks) else ""
        if kind == "open":
            stack.append((text, text == "{" or label_list))
            label_list = False
        elif kind == "close":
            if not stack or _PAIRS[text] != stack[-1][0]:
                raise PromQLError(f"unbalanced {text!r} in {expr!r}")
            stack.pop()
        elif kind != "ident" or (stack and stack[-1][1]):
            continue  # not a name, or a label name
        elif text in GROUPING:
            label_list = following == "("
        elif text in FUNCTIONS and following in ("by", "without"):
            continue  # an aggregation with its grouping first: sum by (x) (...)
        elif following == "(":
            if text not in FUNCTIONS:
                raise PromQLError(f"unknown function {text!r} in {expr!r}")
        elif text.lower() not in KEYWORDS:
            names.add(text)
    if stack:
        raise PromQLError(f"unclosed {stack[-1][0]!r} in {expr!r}")
    return names
