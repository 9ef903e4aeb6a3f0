"""`common.auth.authenticate`: who a bearer is, with a token, a keys file, or both."""

from __future__ import annotations

import pytest

from luftpause.common.auth import ANYONE, Identity, Refused, authenticate
from luftpause.common.keys import Keys, hash_key, parse_keys

TOKEN = b"operator-token"


def keys() -> Keys:
    return parse_keys(
        {
            "keys": [
                {"name": "team-a", "sha256": hash_key("a-key"), "classes": ["batch"]},
                {"name": "team-b", "sha256": hash_key("b-key"), "tokens_per_minute": 100},
                {"name": "runtime", "sha256": hash_key("rt-key"), "acts_for": True},
            ]
        }
    )


NO_KEYS = Keys()


def who(
    header: str | None,
    on_behalf_of: str | None = None,
    *,
    token: bytes | None = TOKEN,
    keys_file: Keys | None = NO_KEYS,
) -> Identity:
    """`authenticate` with the token and the three keys unless told otherwise."""
    table = keys() if keys_file is NO_KEYS else keys_file
    return authenticate(header, on_behalf_of, token=token, keys=table)


def refusal(
    header: str | None,
    on_behalf_of: str | None = None,
    *,
    token: bytes | None = TOKEN,
    keys_file: Keys | None = NO_KEYS,
) -> Refused:
    with pytest.raises(Refused) as caught:
        who(header, on_behalf_of, token=token, keys_file=keys_file)
    return caught.value


def test_a_key_is_its_caller_with_its_classes_and_budget() -> None:
    a = who("Bearer a-key")
    assert a.caller == "team-a" and a.key is not None and a.key.classes == {"batch"}
    b = who("bearer  b-key ")
    assert b.key is not None and b.key.tokens_per_minute == 100


def test_the_operator_token_is_anyone_and_still_works_beside_keys() -> None:
    assert who("Bearer operator-token") == ANYONE
    assert who("Bearer operator-token").caller == ""
    assert who("Bearer operator-token", keys_file=None) == ANYONE


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer nope", "Basic a-key", "a-key"])
def test_a_missing_or_unknown_bearer_is_401(header: str | None) -> None:
    assert refusal(header).status == 401


def test_without_a_token_only_keys_pass_and_without_keys_only_the_token() -> None:
    assert refusal("Bearer operator-token", token=None).status == 401
    assert refusal("Bearer a-key", keys_file=None).status == 401


def test_a_service_key_or_the_operator_acts_for_a_key_by_name() -> None:
    acting = who("Bearer rt-key", "team-b")
    assert acting.caller == "team-b" and acting.via == "runtime"
    assert who("Bearer operator-token", "team-a").caller == "team-a"
    assert who("Bearer rt-key").caller == "runtime"  # for itself without the header


def test_a_plain_key_may_not_act_for_another_and_nobody_for_an_unknown_name() -> None:
    refused = refusal("Bearer a-key", "team-b")
    assert refused.status == 403 and "key 'team-a' may not act for other keys" in refused.message
    assert who("Bearer a-key", "team-a").caller == "team-a"  # for itself: harmless
    refused = refusal("Bearer rt-key", "team-z")
    assert refused.status == 403 and "no key named 'team-z'" in refused.message


def test_without_keys_the_on_behalf_of_header_is_ignored_as_before() -> None:
    assert who("Bearer operator-token", "team-a", keys_file=None) == ANYONE


def test_a_class_the_key_may_not_use_is_403_and_the_operator_may_use_any() -> None:
    a = who("Bearer a-key")
    a.check_class("batch")
    with pytest.raises(Refused) as caught:
        a.check_class("interactive")
    assert caught.value.status == 403
    assert caught.value.message == "key 'team-a' may not use class 'interactive'"
    ANYONE.check_class("interactive")
