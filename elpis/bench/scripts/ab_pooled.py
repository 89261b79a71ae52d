"""The pooled A/B of alternating `elpis bench engine` runs (report.pooled_ab), as a table and JSON.

Usage: python3 ab_pooled.py SYSTEM OUT.json --a RUN.json [RUN.json ...] --b RUN.json [RUN.json ...]
       [--b-system OTHER]  (arm B is OTHER in its runs: e.g. elpis-tree16 against stock in the same runs)
Pools every run, and again without the disturbed measurements (report.disturbed); both go to the JSON
("rows", "rows_undisturbed") and the printout. With as many runs in each arm, the i-th runs pair up, and each
row also says in how many pairs A was faster, with the sign test's p-value (information; the noise rule alone
gives the verdict).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from elpis.bench.report import NOISE_MADS, pooled_ab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("system")
    parser.add_argument("out", type=Path)
    parser.add_argument("--a", nargs="+", type=Path, required=True, help="arm A's runs (result JSON)")
    parser.add_argument("--b", nargs="+", type=Path, required=True, help="arm B's runs (result JSON)")
    parser.add_argument("--b-system", default=None, help="arm B's system (default: SYSTEM)")
    args = parser.parse_args()
    b_system = args.b_system or args.system
    a_docs = [json.loads(p.read_text()) for p in args.a]
    # the same files for both arms are the same runs: one list, so disturbed runs leave both arms
    b_docs = a_docs if args.a == args.b else [json.loads(p.read_text()) for p in args.b]
    rows = pooled_ab(a_docs, b_docs, args.system, b_system)
    doc = {"system": args.system, "b_system": b_system, "a": [p.name for p in args.a],
           "b": [p.name for p in args.b], "rows": rows}  # fmt: skip
    try:
        doc["rows_undisturbed"] = pooled_ab(a_docs, b_docs, args.system, b_system, skip_disturbed=True)
    except ValueError as error:  # every run of an arm disturbed at some context
        doc["rows_undisturbed"] = str(error)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"A {args.system} {doc['a']} vs B {b_system} {doc['b']}", end=" ")
    print(f"(noise {NOISE_MADS:g} x the larger pooled MAD)")
    for title, rows in (("every run", doc["rows"]), ("without disturbed runs", doc["rows_undisturbed"])):
        print(f"{title}:")
        if isinstance(rows, str):
            print(f"  {rows}")
            continue
        for r in rows:
            pairs = ""
            if "pairs" in r:
                pairs = f"; A faster in {r['pairs_a_faster']} of {r['pairs']} run pairs"
                pairs += f" (sign test p {r['sign_p']:.3g})"
            print(
                f"  {r['label']}: A {r['a_ms']:.2f} ms ({r['a_runs']} runs, {r['a_rounds']} rounds), "
                f"B {r['b_ms']:.2f} ms ({r['b_runs']} runs, {r['b_rounds']}), gain {r['gain_ms']:.2f} ms, "
                f"noise {r['noise_ms']:.2f} ms: {r['verdict']}{pairs}"
            )


if __name__ == "__main__":
    main()
