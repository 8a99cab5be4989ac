"""MigrationPolicy: the advice pairs each policy issues, combination, equality, repr."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import cuda_memkit as cm

pytestmark = pytest.mark.uses_managed_memory

A = cm.MemAdvice
L = cm.Location
P = cm.MigrationPolicy


def test_default_issues_nothing() -> None:
    p = P.default()
    assert p.advice == ()
    assert p.is_default
    assert p == P()
    assert repr(p) == "MigrationPolicy.default()"
    assert str(p) == "default (no advice)"


def test_read_mostly() -> None:
    assert P.read_mostly().advice == ((A.SET_READ_MOSTLY, None),)
    assert P.read_mostly().is_read_mostly
    assert not P.read_mostly().is_default


@pytest.mark.parametrize("n", [0, 1, 3])
def test_prefer_device_targets_device_n(n: int) -> None:
    p = P.prefer_device(n)
    assert p.advice == ((A.SET_PREFERRED_LOCATION, L.device(n)),)
    assert p.preferred_location == L.device(n)


def test_prefer_host_targets_the_host_location() -> None:
    (adv, loc), = P.prefer_host().advice
    assert adv is A.SET_PREFERRED_LOCATION
    assert loc is not None and loc.type is cm.LocationType.HOST


def test_prefer_any_location() -> None:
    assert P.prefer(L.host_numa(0)).preferred_location == L.host_numa(0)
    assert P.prefer(2).preferred_location == L.device(2)


def test_prefer_device_accepts_a_device() -> None:
    assert P.prefer_device(cm.Device(0)) == P.prefer_device(0)


def test_combined_with_accessed_by() -> None:
    p = P.prefer_device(0).with_accessed_by(L.host(), 1)
    assert p.advice == (
        (A.SET_PREFERRED_LOCATION, L.device(0)),
        (A.SET_ACCESSED_BY, L.device(1)),
        (A.SET_ACCESSED_BY, L.host()),
    )
    assert p.accessed_by == (L.device(1), L.host())


def test_with_accessed_by_returns_a_new_policy() -> None:
    base = P.read_mostly()
    more = base.with_accessed_by(0)
    assert base.accessed_by == () and more.accessed_by == (L.device(0),)


def test_accessed_by_order_and_duplicates_do_not_matter() -> None:
    a = P.default().with_accessed_by(L.host(), 0, 0)
    b = P.default().with_accessed_by(0).with_accessed_by(L.host())
    assert a == b and hash(a) == hash(b)
    assert len(a.advice) == 2


def test_merge_with_or() -> None:
    p = P.read_mostly() | P.prefer_device(0) | P.default().with_accessed_by(0)
    assert p.advice == (
        (A.SET_READ_MOSTLY, None),
        (A.SET_PREFERRED_LOCATION, L.device(0)),
        (A.SET_ACCESSED_BY, L.device(0)),
    )
    assert P.prefer_device(0) | P.prefer_device(0) == P.prefer_device(0)


def test_merge_conflicting_preferences_is_an_error() -> None:
    with pytest.raises(ValueError, match="prefer"):
        _ = P.prefer_device(0) | P.prefer_host()


def test_merge_with_something_else_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        _ = P.read_mostly() | 3


def test_equality_and_hash() -> None:
    assert P.prefer_device(1) == P.prefer_device(1)
    assert P.prefer_device(1) != P.prefer_device(0)
    assert P.prefer_host() != P.prefer_device(0)
    assert P.read_mostly() != "read_mostly"
    assert len({P.read_mostly(), P.read_mostly(), P.prefer_host()}) == 2


@pytest.mark.parametrize(("kwargs", "exc"), [
    ({"accessed_by": [L.host_numa(0)]}, ValueError),
    ({"accessed_by": [L.host_numa_current()]}, ValueError),
    ({"accessed_by": L.host()}, TypeError),
    ({"accessed_by": ["host"]}, TypeError),
    ({"preferred_location": -1}, ValueError),
    ({"preferred_location": "gpu"}, TypeError),
    ({"read_mostly": 1}, TypeError),
])
def test_bad_policies(kwargs: dict[str, object], exc: type) -> None:
    with pytest.raises(exc):
        P(**kwargs)  # type: ignore[arg-type]


def test_prefer_device_rejects_negative_and_bool() -> None:
    with pytest.raises(ValueError):
        P.prefer_device(-1)
    with pytest.raises(TypeError):
        P.prefer_device(True)


@pytest.mark.parametrize("p", [
    P.default(),
    P.read_mostly(),
    P.prefer_device(2),
    P.prefer_host(),
    P.prefer(L.host_numa(1)),
    P.prefer(L.host_numa_current()),
    P.read_mostly() | P.prefer_host(),
    P.prefer_device(0).with_accessed_by(L.host(), 1),
    P.default().with_accessed_by(0),
])
def test_repr_round_trips(p: cm.MigrationPolicy) -> None:
    assert eval(repr(p), {"MigrationPolicy": P, "Location": L}) == p


def test_str_is_readable() -> None:
    text = str(P.read_mostly() | P.prefer_device(0).with_accessed_by(L.host()))
    assert text == "read-mostly; prefer device 0; accessed by host"


locations = st.one_of(
    st.integers(0, 7).map(L.device),
    st.just(L.host()),
    st.integers(0, 3).map(L.host_numa),
    st.just(L.host_numa_current()),
)
accessors = st.one_of(st.integers(0, 7).map(L.device), st.just(L.host()))


@given(st.booleans(), st.none() | locations, st.lists(accessors, max_size=5))
def test_policy_properties(rm: bool, pref: cm.Location | None,
                           acc: list[cm.Location]) -> None:
    p = P(read_mostly=rm, preferred_location=pref, accessed_by=acc)
    assert len(p.advice) == int(rm) + int(pref is not None) + len(set(acc))
    assert eval(repr(p), {"MigrationPolicy": P, "Location": L}) == p
    assert p | p == p
    assert p == P(read_mostly=rm, preferred_location=pref, accessed_by=reversed(acc))
    kinds = [adv for adv, _ in p.advice]
    assert kinds == sorted(kinds)  # read-mostly, then preferred, then accessed-by
