"""The config's plain-string checks answer exactly as the patterns they stand for.

``tfpipe.config`` checks names, sizes, the user, Kubernetes names and cron fields without compiling
a regular expression (a DAG file's parse would pay the compilation every time). Each check is
compared with its pattern under ``re.fullmatch`` and ``re.ASCII`` on every string of up to four
characters over an alphabet of the characters that decide the answers: ASCII and non-ASCII decimal
digits (refused: Docker reads ASCII numbers only), a digit that is not decimal, letters of both
cases, the size suffixes, the separators, whitespace and a newline (refused at the end too, where
``re.match``'s ``$`` would have let it into a name).
"""

from __future__ import annotations

import itertools
import re

import pytest

from tfpipe import config, contract

ALPHABET = ["0", "7", "\u0661", "\u00b2", "a", "z", "A", "Z", "g", "M", ".", "-", "_", ":", "*", "/", "\n", " "]


def _strings(max_len: int = 4):
    for n in range(max_len + 1):
        for chars in itertools.product(ALPHABET, repeat=n):
            yield "".join(chars)


def _full(pattern, value):
    return re.fullmatch(pattern, value, re.ASCII)


CASES = [
    ("matches_name", lambda v: bool(_full(contract.NAME_PATTERN, v))),
    ("matches_size", lambda v: bool(_full(config._MEM, v))),
    ("matches_user", lambda v: bool(_full(config._USER, v))),
    ("matches_k8s_name", lambda v: bool(_full(config._K8S_NAME, v))),
]


@pytest.mark.parametrize("name,pattern", CASES, ids=[c[0] for c in CASES])
def test_a_plain_check_answers_as_its_pattern(name, pattern):
    check = getattr(config, name)
    wrong = [v for v in _strings() if check(v) != pattern(v)]
    assert wrong == [], f"{name} differs from its pattern on {wrong[:10]}"


def test_cron_item_groups_are_the_patterns_groups():
    def by_pattern(item):
        match = _full(config._CRON_ITEM, item)
        return match.groups()[1:] if match else None

    wrong = [v for v in _strings() if config.cron_item_groups(v) != by_pattern(v)]
    assert wrong == [], f"cron_item_groups differs from _CRON_ITEM on {wrong[:10]}"


def test_the_alphabet_reaches_both_answers():
    """Guards the comparison itself: each check accepts some strings and refuses others."""
    strings = list(_strings(3))
    for name, _ in CASES:
        answers = {getattr(config, name)(v) for v in strings}
        assert answers == {True, False}, name
    assert {config.cron_item_groups(v) is None for v in strings} == {True, False}


@pytest.mark.parametrize("value", ["digits\n", "\u0661\u0662"])
def test_a_name_with_a_final_newline_or_a_non_ascii_digit_is_refused(value):
    with pytest.raises(config.TfpipeConfigError, match="must be a name"):
        config.check_name("model_name", value)
    assert not config.matches_user(value) and not config.matches_size(value)
