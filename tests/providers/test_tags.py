"""Property tests for the ownership-tag validator (``providers.tags``).

The oracles below are written character by character, independently of the module's regular
expressions, so a regex mistake (e.g. ``$`` accepting a trailing newline) shows up.
"""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from providers.errors import InvalidRequestError
from providers.tags import (
    CLUSTER_ID_TAG,
    MANAGED_BY_TAG,
    MANAGED_BY_VALUE,
    MAX_USER_TAGS,
    REQUEST_ID_TAG,
    RESERVED_TAGS,
    all_tags,
    is_owned_by,
    ownership_tags,
    validate_id,
    validate_user_tags,
)

LOWER = string.ascii_lowercase
DIGITS = string.digits


def id_ok(s: str) -> bool:
    return (
        1 <= len(s) <= 63 and s[0] in LOWER + DIGITS and all(c in LOWER + DIGITS + "-" for c in s)
    )


def key_ok(s: str) -> bool:
    return 1 <= len(s) <= 63 and s[0] in LOWER and all(c in LOWER + DIGITS + "-_" for c in s)


def value_ok(s: str) -> bool:
    return len(s) <= 63 and all(c in LOWER + DIGITS + "-_" for c in s)


# Mostly-valid alphabets with a sprinkle of troublemakers, so both sides get exercised.
near_alphabet = st.sampled_from(list(LOWER + DIGITS + "-_") + list("A \n\t.Z/é\x00"))
near_text = st.text(near_alphabet, max_size=70)
valid_ids = st.builds(
    str.__add__, st.sampled_from(LOWER + DIGITS), st.text(LOWER + DIGITS + "-", max_size=62)
)
valid_keys = st.builds(
    str.__add__, st.sampled_from(LOWER), st.text(LOWER + DIGITS + "-_", max_size=62)
).filter(lambda k: k not in RESERVED_TAGS)
valid_values = st.text(LOWER + DIGITS + "-_", max_size=63)


@given(near_text)
def test_validate_id_accepts_exactly_the_documented_alphabet(s: str) -> None:
    if id_ok(s):
        assert validate_id(s, field="cluster_id") == s
    else:
        with pytest.raises(InvalidRequestError, match="cluster_id"):
            validate_id(s, field="cluster_id")


@given(valid_ids, st.sampled_from(["\n", " ", "\t", "A", "."]))
def test_validate_id_rejects_any_trailing_junk(s: str, junk: str) -> None:
    with pytest.raises(InvalidRequestError):
        validate_id(s + junk, field="request_id")


@given(st.one_of(st.integers(), st.none(), st.binary(max_size=5)))
def test_validate_id_rejects_non_strings(value: object) -> None:
    with pytest.raises(InvalidRequestError):
        validate_id(value, field="request_id")  # type: ignore[arg-type]


@given(near_text, near_text)
def test_single_tag_accepted_iff_key_and_value_are_well_formed(key: str, value: str) -> None:
    if key_ok(key) and value_ok(value) and key not in RESERVED_TAGS:
        assert validate_user_tags({key: value}) == {key: value}
    else:
        with pytest.raises(InvalidRequestError):
            validate_user_tags({key: value})


@given(st.dictionaries(valid_keys, valid_values, max_size=MAX_USER_TAGS))
def test_well_formed_tag_sets_round_trip_as_plain_copies(tags: dict[str, str]) -> None:
    out = validate_user_tags(tags)
    assert out == tags
    assert out is not tags


@pytest.mark.parametrize("n", [MAX_USER_TAGS + 1, 2 * MAX_USER_TAGS])
def test_too_many_tags_are_refused(n: int) -> None:
    validate_user_tags({f"k{i}": "v" for i in range(MAX_USER_TAGS)})  # the limit itself is fine
    with pytest.raises(InvalidRequestError, match="at most"):
        validate_user_tags({f"k{i}": "v" for i in range(n)})


@pytest.mark.parametrize("key", sorted(RESERVED_TAGS))
def test_reserved_keys_are_refused(key: str) -> None:
    with pytest.raises(InvalidRequestError, match="reserved"):
        validate_user_tags({key: "x"})


@pytest.mark.parametrize("tags", [None, [("a", "b")], "a=b", {"a": 1}, {1: "a"}])
def test_non_string_mappings_are_refused(tags: object) -> None:
    with pytest.raises(InvalidRequestError):
        validate_user_tags(tags)  # type: ignore[arg-type]


@given(valid_ids, valid_ids, valid_ids, st.dictionaries(valid_keys, valid_values, max_size=8))
def test_all_tags_carry_ownership_and_only_own_cluster_matches(
    cluster: str, other: str, request: str, user: dict[str, str]
) -> None:
    tags = all_tags(cluster, request, user)
    assert tags[CLUSTER_ID_TAG] == cluster
    assert tags[REQUEST_ID_TAG] == request
    assert tags[MANAGED_BY_TAG] == MANAGED_BY_VALUE
    assert {k: v for k, v in tags.items() if k not in RESERVED_TAGS} == user
    assert tags == {**user, **ownership_tags(cluster, request)}
    assert is_owned_by(tags, cluster)
    assert is_owned_by(tags, other) == (other == cluster)


def test_ownership_needs_the_managed_by_tag() -> None:
    assert not is_owned_by({CLUSTER_ID_TAG: "c1"}, "c1")
    assert not is_owned_by({CLUSTER_ID_TAG: "c1", MANAGED_BY_TAG: "someone"}, "c1")
    assert not is_owned_by({}, "c1")
    assert is_owned_by({CLUSTER_ID_TAG: "c1", MANAGED_BY_TAG: MANAGED_BY_VALUE}, "c1")


def test_ownership_tags_validate_their_ids() -> None:
    with pytest.raises(InvalidRequestError):
        ownership_tags("Bad Cluster", "req-1")
    with pytest.raises(InvalidRequestError):
        ownership_tags("c1", "req_1")
