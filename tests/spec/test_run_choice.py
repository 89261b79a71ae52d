"""The choice of a tree round's verify shape (`elpis.spec.run_choice`): the counterfactual count, the
estimates, the choice by tokens per second and the exploration rounds."""

from __future__ import annotations

import random

import pytest

from elpis.backend import DraftBlock
from elpis.spec.run_choice import RunChoice, tokens_within
from elpis.spec.tree import build_tree
from tests.spec.alternate_runs import Alternate


def test_a_path_inside_the_smaller_tree_commits_the_same_there() -> None:
    parents = [-1, 0, 1, 2, 0, 4]
    assert tokens_within(parents, [0, 1, 2, 3], 4) == 4
    assert tokens_within(parents, [0, 1, 2, 3], 16) == 4


def test_a_path_leaving_the_smaller_tree_is_cut_where_it_leaves() -> None:
    # rows 0-7 and a deeper branch through rows 8 and 9: eight rows keep the path to row 2 only
    parents = [-1, 0, 1, 0, 3, 0, 5, 0, 2, 8]
    assert tokens_within(parents, [0, 1, 2, 8, 9], 8) == 3
    assert tokens_within(parents, [0, 1, 2, 8, 9], 9) == 4
    assert tokens_within(parents, [0, 1, 2, 8, 9], 10) == 5
    assert tokens_within(parents, [0], 1) == 1


@pytest.mark.parametrize("path", [[], [1], [0, 2], [0, 1, 3, 11]])
def test_a_path_that_is_not_a_root_first_path_is_refused(path: list[int]) -> None:
    parents = [-1, 0, 1, 0]
    with pytest.raises(ValueError, match="path"):
        tokens_within(parents, path, 4)


def test_the_first_rows_of_a_best_first_tree_are_the_smaller_budgets_tree() -> None:
    """What the counterfactual rests on: build_tree with 8 rows is the first 8 rows of build_tree with 16,
    on random draft blocks (ties included)."""
    rng = random.Random(5)
    for _ in range(200):
        block = DraftBlock([[(rng.randrange(50), -rng.choice([0.0, 0.1, 0.5, 1.0, 2.0, 3.5]))
                             for _ in range(4)] for _ in range(7)])  # fmt: skip
        small = build_tree(7, block, 8, vocab_size=50)
        large = build_tree(7, block, 16, vocab_size=50)
        assert large.tokens[: len(small)] == small.tokens
        assert large.parents[: len(small)] == small.parents


def flat_cost(ratio_at: dict[int, float]) -> object:
    """A round's seconds: 1 at the smallest run, ratio_at[kvp bucket] at 16 rows."""

    def cost(run: int, kvp: int) -> float:
        bucket = max(k for k in ratio_at if k <= kvp)
        return ratio_at[bucket] if run == 16 else 1.0

    return cost


def feed(choice: RunChoice, rounds: int, path16: list[int], parents: list[int], kvp: int = 0) -> list[int]:
    """Rounds as a driver runs them: choose, record, then observe the same accepted path (cut to the run)."""
    runs = []
    for _ in range(rounds):
        run = choice.choose(kvp, 16)
        choice.chose(run, 16)
        runs.append(run)
        path = [r for r in path16 if r < run]
        path = path[: next((i for i, r in enumerate(path16) if r >= run), len(path16))]
        choice.observe(run, 16, parents[:run], path)
    return runs


PARENTS = [-1, 0, 1, 2, 3, 0, 5, 6, 4, 8, 9, 10, 11, 12, 13, 14]  # rows 8-15 deepen the row 1-4 chain


def test_the_largest_run_is_taken_until_enough_rounds_are_seen() -> None:
    choice = RunChoice((8, 16), flat_cost({0: 2.0}), min_rounds=5)
    assert feed(choice, 5, [0, 1, 2, 3, 4, 8, 9], PARENTS) == [16] * 5
    assert choice.estimate(16) == {8: 5.0, 16: 7.0}


def test_sixteen_rows_are_kept_while_they_commit_enough_more_to_pay_for_themselves() -> None:
    # 7 tokens against 5 a round: 1.4x, at a cost 1.2x
    choice = RunChoice((8, 16), flat_cost({0: 1.2}), min_rounds=4)
    assert set(feed(choice, 40, [0, 1, 2, 3, 4, 8, 9], PARENTS)) == {16}


def test_eight_rows_are_chosen_where_sixteen_cost_more_than_they_commit_and_sixteen_explore() -> None:
    # the same 1.4x more tokens, at a cost 1.6x: eight rows, and every fourth round sixteen again
    choice = RunChoice((8, 16), flat_cost({0: 1.6}), min_rounds=4, explore_every=4)
    runs = feed(choice, 44, [0, 1, 2, 3, 4, 8, 9], PARENTS)
    assert runs[:4] == [16] * 4
    assert runs[4:] == [8, 8, 8, 16] * 10
    assert choice.chosen == {16: 14, 8: 30}


def test_the_choice_follows_the_context_through_the_cost() -> None:
    choice = RunChoice((8, 16), flat_cost({0: 1.1, 65536: 1.3}), min_rounds=4)
    feed(choice, 4, [0, 1, 2, 3, 4, 8], PARENTS)  # 6 tokens against 5: 1.2x
    assert choice.choose(1000, 16) == 16
    assert choice.choose(70_000, 16) == 8


def test_the_estimates_follow_the_text_when_it_changes() -> None:
    """Paths that stay in the first eight rows make sixteen worth nothing more: the means move (sixteen's
    only in its exploration rounds) and the choice with them."""
    choice = RunChoice((8, 16), flat_cost({0: 1.15}), min_rounds=4, window=8)
    assert set(feed(choice, 20, [0, 1, 2, 3, 4, 8, 9, 10], PARENTS)) == {16}
    later = feed(choice, 40, [0, 1, 2, 3], PARENTS)
    assert later[-8:].count(8) >= 6
    assert choice.estimate(16)[8] == pytest.approx(4.0, rel=0.01)
    assert choice.estimate(16)[16] < 5.0


def test_a_budget_of_eight_rows_or_fewer_has_one_run() -> None:
    choice = RunChoice((8, 16), flat_cost({0: 5.0}), min_rounds=1)
    for budget in (1, 5, 8):
        assert choice.choose(0, budget) == 8
        choice.chose(8, budget)
        choice.observe(8, budget, [-1, 0], [0, 1])
    assert choice.largest(9) == 16
    with pytest.raises(ValueError, match="over the largest run"):
        choice.largest(17)


def test_rounds_that_do_not_fit_their_run_are_refused() -> None:
    choice = RunChoice((8, 16), flat_cost({0: 1.0}))
    with pytest.raises(ValueError, match="not one of the runs"):
        choice.observe(16, 8, [-1], [0])
    with pytest.raises(ValueError, match="does not fit"):
        choice.observe(8, 16, list(range(-1, 9)), [0])
    with pytest.raises(ValueError, match="not one of the runs"):
        choice.chose(12, 16)


def test_a_cost_that_is_not_a_time_is_refused() -> None:
    choice = RunChoice((8, 16), lambda run, kvp: 0.0, min_rounds=1)
    choice.observe(16, 16, [-1, 0], [0, 1])
    with pytest.raises(ValueError, match="not a positive time"):
        choice.choose(0, 16)


class WithRunChoice:
    """A reference backend with a run choice, as an Exl3Backend loaded with run_choice=True has one, that also
    records every verify's row count."""

    def __init__(self, inner, choice) -> None:
        self.inner, self.info, self.run_choice = inner, inner.info, choice
        self.commit, self.abandon, self.finish = inner.commit, inner.abandon, inner.finish
        self.begin, self.position = inner.begin, inner.position
        self.rows: list[int] = []

    def verify(self, tokens, parents):
        self.rows.append(len(tokens))
        return self.inner.verify(tokens, parents)


@pytest.mark.parametrize(
    "sampling", [{"temperature": 0.0, "top_logprobs": 2}, {"temperature": 0.8, "seed": 11}],
    ids=["logprobs", "sampled"],
)
def test_host_rounds_at_the_chosen_row_count_keep_plain_decodings_text(tiny_models, run, sampling) -> None:
    """Host rounds (sampled requests and those asking for logprobs) with the backend's run choice: each tree
    is cut to the round's row count, the choice hears what each round accepted, and the output (tokens,
    text, log-probabilities) is plain decoding's."""
    from elpis.spec import GenerationRequest, SamplingParams
    from elpis.spec.drafters import OracleDrafter

    model = tiny_models[0]
    params = SamplingParams(temperature=sampling["temperature"], seed=sampling.get("seed", 0))
    prompt = tuple(model.tokenizer.encode("one two three, one two three, one two"))
    logprobs = sampling.get("top_logprobs")
    request = GenerationRequest(prompt, 40, params, top_logprobs=logprobs, ignore_eos=True)
    plain = run(model.backend(), model.tokenizer, request)
    choice = Alternate()
    backend = WithRunChoice(model.backend(), choice)
    drafter = OracleDrafter(model.backend(), request.sampling)
    got = run(backend, model.tokenizer, request, drafter, tree_budget=16)
    assert got.same_output(plain)
    assert {run for run, _, _ in choice.seen} == {8, 16}
    assert all(rows <= run and path[0] == 0 for run, rows, path in choice.seen)
    assert max(backend.rows) > 8 and max(len(path) for _, _, path in choice.seen) > 1
