"""The interpreter runs the specs as written; they agree with plain-Python renditions of the rules."""

from __future__ import annotations

import itertools
import random

import pytest

from elpis.bend.interp import Data
from elpis.bend.prims import PRIMS

CHAIN_SPEC = "bend/chain_spec.bend::accept"
TREE_SPEC = "bend/tree_spec.bend::accept"
TREE_SPEC_ROWS = "bend/tree_spec.bend::rows"


def chain_rule(draft, target, stops, budget):
    """CONTRACTS.md's chain rule, position by position."""
    k = len(draft)
    for i in range(k + 1):
        n = i + 1
        if target[i] in stops or n >= budget:
            return n, True
        if i == k or draft[i] != target[i]:
            return n, False
    raise AssertionError("unreachable")


def tree_rule(parents, draft, target, stops, budget):
    path = [0]
    while True:
        cur = path[-1]
        nxt = next((c for c in range(1, len(parents)) if parents[c] == cur and draft[c] == target[cur]), None)
        if nxt is None:
            break
        path.append(nxt)
    lin_draft = [draft[r] for r in path[1:]]
    lin_target = [target[r] for r in path]
    count, ends = chain_rule(lin_draft, lin_target, stops, budget)
    return tuple(path[:count]), count, ends


def masks_rule(parents):
    anc, depth = [1], [0]
    for r in range(1, len(parents)):
        anc.append(anc[parents[r]] | (1 << r))
        depth.append(depth[parents[r]] + 1)
    return tuple(depth), tuple(anc)


def random_chain(rng):
    k = rng.randint(0, 15)
    alphabet = [rng.getrandbits(32) for _ in range(3)]
    draft = tuple(rng.choice(alphabet) for _ in range(k))
    target = tuple(rng.choice(alphabet) for _ in range(k + 1))
    stops = tuple(rng.sample([*alphabet, rng.getrandbits(32)], rng.randint(0, 4)))
    return draft, target, stops, rng.choice([1, 2, 3, k + 1, k + 2, 2**48 - 1])


def random_tree(rng):
    rows = rng.randint(1, 16)
    parents = tuple([0] + [rng.randrange(r) for r in range(1, rows)])
    alphabet = [rng.getrandbits(32) for _ in range(2)]
    draft = tuple(rng.choice(alphabet) for _ in range(rows))
    target = tuple(rng.choice(alphabet) for _ in range(rows))
    stops = tuple(rng.sample([*alphabet, 7], rng.randint(0, 2)))
    return parents, draft, target, stops, rng.choice([1, 2, 4, 17, 2**48 - 1])


def test_chain_spec_matches_python(interp):
    spec = interp.function(CHAIN_SPEC)
    rng = random.Random(11)
    for _ in range(3000):
        draft, target, stops, budget = random_chain(rng)
        got = spec(draft, target, stops, budget)
        assert got == Data("ChainDecision", chain_rule(draft, target, stops, budget))


def test_tree_spec_matches_python(interp):
    spec, rows = interp.function(TREE_SPEC), interp.function(TREE_SPEC_ROWS)
    rng = random.Random(12)
    for _ in range(1500):
        args = random_tree(rng)
        path, count, ends = tree_rule(*args)
        assert spec(*args) == Data("TreeDecision", (count, ends))
        assert rows(*args) == path


def test_masks_impl_matches_python(interp):
    depths, ancestors = (
        interp.function("bend/masks.bend::depths"),
        interp.function("bend/masks.bend::ancestors"),
    )
    rng = random.Random(13)
    for _ in range(500):
        rows = rng.randint(1, 16)
        parents = tuple([0] + [rng.randrange(r) for r in range(1, rows)])
        assert (depths(parents), ancestors(parents)) == masks_rule(parents)


def test_plain_decoding_and_serving(interp):
    def nxt(seq):
        return (sum(seq) * 7 + len(seq)) % 4

    plain = interp.function("bend/decode.bend::plain")
    out = []
    seq = [1]
    for _ in range(6):
        t = nxt(tuple(seq))
        out.append(t)
        seq.append(t)
        if t == 3:
            break
    assert plain(nxt, (3,), 6, (1,), False) == tuple(out)

    def verify(seq, parents, draft):
        return interp.call("bend/decode.bend::tree_rows", nxt, parents, draft, seq)

    serve = interp.function("bend/decode.bend::serve")
    rng = random.Random(14)
    for _ in range(200):
        plans = []
        for _ in range(rng.randint(0, 4)):
            rows = rng.randint(1, 6)
            parents = tuple([0] + [rng.randrange(r) for r in range(1, rows)])
            plans.append(Data("Plan", (parents, tuple(rng.randrange(4) for _ in range(rows)))))
        budget = rng.randint(0, 9)
        assert serve(nxt, verify, tuple(plans), (3,), budget, (1,), False) == plain(
            nxt, (3,), budget, (1,), False
        )


@pytest.mark.parametrize("op", sorted(k for k in PRIMS if k.startswith(("Nat.", "Bool."))))
def test_primitives_agree_with_base_definitions(interp, op):
    """The kernel unfolds base.bend; the interpreter, SMT and C use the primitive: same function."""
    key = f"Base::{op}"
    if key not in interp.prog.funs:
        pytest.skip(f"{op} has no Bend definition")
    fn = interp.function(key)
    domain = [False, True] if op.startswith("Bool.") else range(7)
    arity = len(PRIMS[op].params)
    for args in itertools.product(domain, repeat=arity):
        assert fn(*args) == PRIMS[op].fn(*args), (op, args)
