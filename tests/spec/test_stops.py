"""Stop strings: the text is cut exactly at the first one, whatever the chunking; nothing leaks past it."""

from __future__ import annotations

import random

import pytest

from elpis.spec.stops import StopStringScanner


def _run(chunks: list[str], stops: list[str]) -> tuple[list[str], bool, str]:
    scanner = StopStringScanner(stops)
    out = []
    for chunk in chunks:
        if scanner.feed(chunk):
            out.append(scanner.release(final=True))
            return out, True, scanner.text
        out.append(scanner.release(final=False))
    out.append(scanner.release(final=True))
    return out, False, scanner.text


def test_cut_across_chunks_and_holding_back() -> None:
    out, stopped, text = _run(["Hello wo", "rld! E", "ND here"], ["END"])
    assert stopped and text == "Hello world! "
    assert out == ["Hello wo", "rld! ", ""]  # "E" was held back: it may start "END"
    out, stopped, _ = _run(["abc E", "x"], ["END"])
    assert not stopped and out == ["abc ", "Ex", ""]
    out, stopped, _ = _run(["tail E"], ["END"])
    assert out == ["tail ", "E"]  # released at the end


def test_earliest_start_wins_among_stops_completed_together() -> None:
    _, stopped, text = _run(["xxabcd"], ["bcd", "abc"])
    assert stopped and text == "xx"


def test_bad_stop_strings_are_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        StopStringScanner([""])


@pytest.mark.parametrize("seed", range(30))
def test_random_chunkings_cut_at_the_first_completed_stop(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "ab \n"
    text = "".join(rng.choice(alphabet) for _ in range(60))
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
             for _ in range(rng.randint(1, 3))]
    # The generator feeds one token's text at a time in plain and speculative decoding alike, so the
    # scanner only has to be exact for a given chunking; random chunkings probe it.
    bounds = sorted(rng.sample(range(1, len(text)), rng.randint(0, 15)))
    chunks = [text[i:j] for i, j in zip([0, *bounds], [*bounds, len(text)], strict=True)]
    out, stopped, scanned = _run(chunks, stops)
    # Detection happens at chunk ends, so the reference is chunk-aligned: the first chunk whose end
    # completes a stop string, earliest start among stops completed within it.
    expected = None
    for end in [*bounds, len(text)]:
        found = [i for s in stops if (i := text.find(s)) != -1 and i + len(s) <= end]
        if found:
            expected = min(found)
            break
    assert stopped == (expected is not None)
    assert "".join(out) == (text if expected is None else text[:expected])
    assert scanned == "".join(out)


@pytest.mark.parametrize(("chunks", "stops", "matched"), [
    (["one two HALT"], ["ALT", "HALT", "nope"], "HALT"),  # the first to start
    (["one two HALT"], ["HALT", "HA"], "HA"),  # the same start: the shorter, complete first
    (["one two H", "A", "LT"], ["HALT", "HA"], "HA"),
    (["one two"], ["nope"], None),
])  # fmt: skip
def test_the_scanner_names_the_stop_string_that_cut_the_text(chunks, stops, matched) -> None:
    scanner = StopStringScanner(stops)
    for chunk in chunks:
        if scanner.feed(chunk):
            break
    assert scanner.matched == matched
    assert (scanner.cut is None) == (matched is None)


def test_the_last_step_names_the_stop_string(tiny_models, run) -> None:
    """A request cut by one of its stop strings says which on its last step (Anthropic's stop_sequence);
    one ended otherwise names none."""
    from elpis.spec import GenerationRequest, SamplingParams

    model = tiny_models[0]
    prompt = tuple(model.tokenizer.encode("one two three, one two three, one two"))
    free = run(model.backend(), model.tokenizer, GenerationRequest(prompt, 24, SamplingParams()))
    assert free.steps[-1].stop_string is None
    words = free.text.split()
    assert len(words) >= 3
    stop = words[2]
    cut = run(model.backend(), model.tokenizer,
              GenerationRequest(prompt, 24, SamplingParams(), stop_strings=("zzzz-never", stop)))  # fmt: skip
    assert cut.finish_reason == "stop" and cut.steps[-1].stop_string == stop
