"""Stop strings: cut at the first one, never leak any part of one while streaming (no model needed)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elelem.errors import InvalidArgumentError
from elelem.text.stop_strings import StopStringFilter, normalize_stop


def expected_output(text: str, stops: tuple[str, ...]) -> str:
    """The text up to the stop string that is complete first as the text grows
    character by character (at one such character, the one that starts first)."""
    for end in range(1, len(text) + 1):
        done = [end - len(s) for s in stops if text[:end].endswith(s)]
        if done:
            return text[:min(done)]
    return text


def stream_through(chunks: list[str], stops: tuple[str, ...]) -> list[str]:
    f = StopStringFilter(stops)
    out = [f.push(c) for c in chunks]
    out.append(f.flush())
    return out


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.lists(st.text(alphabet="ab<|>é😀", max_size=6), max_size=12),
    stops=st.lists(st.text(alphabet="ab<|>é😀", min_size=1, max_size=4), max_size=3),
)
def test_streamed_text_is_always_a_prefix_of_the_cut_text(chunks, stops):
    stops = normalize_stop(stops)
    want = expected_output("".join(chunks), stops)
    released = ""
    for piece in stream_through(chunks, stops):
        released += piece
        # Whatever has been released is final: never a character of a stop string.
        assert want.startswith(released)
    assert released == want


def test_a_stop_string_split_over_many_deltas_never_shows():
    f = StopStringFilter(["<|end|>"])
    seen = [f.push(piece) for piece in ["Hello <", "|", "en", "d|", "> tail"]]
    assert "".join(seen) == "Hello "
    assert f.stopped and f.flush() == ""


def test_held_text_is_released_when_it_turns_out_not_to_be_a_stop():
    f = StopStringFilter(["STOP"])
    assert f.push("a ST") == "a "
    assert f.push("ART") == "START"
    assert f.push("x S") == "x "
    assert f.flush() == "S"


def test_the_earliest_of_several_stops_wins():
    f = StopStringFilter(["world", "lo w"])
    assert f.push("hello world") == "hel"


@pytest.mark.parametrize("chunks", [["a<b"], ["a<", "b"], ["a", "<", "b"]])
def test_the_stop_complete_first_wins_however_the_text_arrives(chunks):
    """"<" is complete before "a<b", which starts earlier: the cut is the same in one piece or several."""
    assert "".join(stream_through(chunks, ("<", "a<b"))) == "a"


@pytest.mark.parametrize("stop, want", [(None, ()), ("x", ("x",)), (["a", "", "a", "b"], ("a", "b"))])
def test_normalize_stop(stop, want):
    assert normalize_stop(stop) == want


@pytest.mark.parametrize("bad", [3, ["a", 3], [b"x"]])
def test_bad_stop_arguments(bad):
    with pytest.raises(InvalidArgumentError):
        normalize_stop(bad)
