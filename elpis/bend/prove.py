"""`prove_all`: parse and check every module, then discharge every law.

A law with a proof def (Bend style: `def Laws.name(..)`) is checked by the proof kernel
(`kernel.py`); a law without one is discharged by z3 (`smt.py`). Every law also gets a vacuity
check (its hypotheses are satisfiable). Nothing is skipped: a law that neither layer proves is a
failure naming the law and its file:line.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from elpis.bend.check import BASE, Program, load
from elpis.bend.errors import BendError
from elpis.paths import REPO_ROOT

PROOF_ENTRY = Path("proofs/PROOF.bend")
LAWS_ENTRY = Path("bend/LAWS.bend")
SOURCE_DIRS = ("bend", "proofs")


@dataclass
class ProofReport:
    ok: bool
    failures: list[str] = field(default_factory=list)
    certificates: list[dict] = field(default_factory=list)
    sources: list[Path] = field(default_factory=list)
    seconds: float = 0.0


def source_files(root: Path) -> list[Path]:
    out: list[Path] = []
    for d in SOURCE_DIRS:
        base = root / d
        if base.is_dir():
            out.extend(sorted(p for p in base.rglob("*.bend") if p.is_file()))
    return out


def load_program(root: Path) -> Program:
    """Load proofs/PROOF.bend and everything it imports; refuse stray or unchecked modules."""
    root = root.resolve()
    entry = root / PROOF_ENTRY
    if not entry.is_file():
        raise BendError(f"{PROOF_ENTRY}: missing (it must import bend/LAWS.bend and every proof module)")
    prog = load(root, [entry])
    laws_key = LAWS_ENTRY.as_posix()
    proof_mod = prog.modules[PROOF_ENTRY.as_posix()]
    if laws_key not in proof_mod.aliases.values():
        raise BendError(f"{PROOF_ENTRY}:1:1: PROOF.bend must import ../bend/LAWS.bend")
    loaded = {k for k in prog.modules if k != BASE}
    for path in source_files(root):
        rel = path.relative_to(root).as_posix()
        if rel not in loaded:
            raise BendError(
                f"{rel}:1:1: not imported (directly or not) by {PROOF_ENTRY}: every module is checked"
            )
    return prog


def _law_keys(prog: Program, only: set[str] | None) -> list[str]:
    keys = []
    for mod in prog.order:
        for key, law in prog.laws.items():
            if law.module == mod and (only is None or law.name in only):
                keys.append(key)
    return keys


def discharge(root: Path, keys: list[str]) -> list[dict]:
    """Prove the given laws; one result dict per law (runs in worker processes too)."""
    from elpis.bend.kernel import check_proof
    from elpis.bend.smt import LawSmt
    from elpis.bend.vacuity import vacuity_witness

    prog = load_program(root)
    results = []
    for key in keys:
        law = prog.laws[key]
        start = time.perf_counter()
        try:
            if key in prog.proofs:
                try:
                    cert = check_proof(prog, key)
                except BendError as err:
                    raise BendError(_explain_kernel_failure(prog, law, err)) from None
                witness = vacuity_witness(prog, law)
                cert["vacuity_witness"] = witness
                results.append(
                    {
                        "key": key,
                        "ok": True,
                        "message": f"proved by the kernel ({cert['steps']} steps)",
                        "certificate": cert,
                    }
                )
            else:
                out = LawSmt(prog, law).run()
                results.append(
                    {"key": key, "ok": out.ok, "message": out.message, "certificate": out.certificate}
                )
        except BendError as err:
            results.append({"key": key, "ok": False, "message": str(err), "certificate": None})
        except Exception as err:  # a bug in a checker must fail the law, loudly, not pass it
            msg = f"{law.loc}: law {law.name}: internal error while proving: {type(err).__name__}: {err}"
            results.append({"key": key, "ok": False, "message": msg, "certificate": None})
        results[-1]["seconds"] = round(time.perf_counter() - start, 3)
        results[-1]["name"] = law.name
        results[-1]["location"] = law.loc
    return results


COUNTEREXAMPLE_SECONDS = 60.0


def _explain_kernel_failure(prog: Program, law, err: BendError) -> str:
    """A proof that no longer checks: say whether the law itself is false (z3, small shapes first)."""
    from elpis.bend.smt import LawSmt

    reason = str(err)
    try:
        out = LawSmt(prog, law).run(deadline=time.perf_counter() + COUNTEREXAMPLE_SECONDS)
    except BendError:
        return reason
    if not out.ok and out.message.startswith("false: counterexample"):
        return f"{law.loc}: law {law.name}: {out.message} (and its proof no longer checks: {reason})"
    return reason


def prove_all(
    root: Path = REPO_ROOT,
    *,
    jobs: int | None = None,
    only: set[str] | None = None,
    progress: Callable[[dict], None] | None = None,
) -> ProofReport:
    start = time.perf_counter()
    root = Path(root).resolve()
    report = ProofReport(ok=False, sources=source_files(root))
    try:
        prog = load_program(root)
    except BendError as err:
        report.failures.append(str(err))
        report.seconds = time.perf_counter() - start
        return report
    keys = _law_keys(prog, only)
    if only is not None:
        keys = _with_dependencies(prog, keys)
    if not keys:
        report.failures.append("no laws to prove" if only is None else f"no law named {sorted(only)}")
    # ELPIS_PROVE_JOBS: more workers on a big machine (the default suits CI's two cores).
    jobs = jobs or int(os.environ.get("ELPIS_PROVE_JOBS") or 0) or min(2, os.cpu_count() or 1)
    # On a big machine, many small batches: idle workers take the next one, so one slow law does not hold
    # up the laws that happened to share its batch (loading the program per batch costs about a second).
    batches = _balance(keys, jobs if jobs <= 2 else jobs * 4)
    results: list[dict] = []
    if jobs <= 1 or len(keys) <= 1:
        for batch in batches:
            for r in discharge(root, batch):
                results.append(r)
                if progress:
                    progress(r)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for batch_results in pool.map(discharge, [root] * len(batches), batches):
                for r in batch_results:
                    results.append(r)
                    if progress:
                        progress(r)
    order = {k: i for i, k in enumerate(keys)}
    results.sort(key=lambda r: order[r["key"]])
    _check_citations(prog, results)
    for r in results:
        if r["ok"]:
            report.certificates.append(r["certificate"])
        else:
            msg = r["message"]
            prefix = f"{r['location']}: law {r['name']}: "
            report.failures.append(msg if msg.startswith(r["location"]) else prefix + msg)
    report.ok = not report.failures
    report.seconds = time.perf_counter() - start
    return report


def _cited(prog: Program, key: str) -> set[str]:
    """The laws a kernel proof cites (empty for z3 laws, or when the proof does not check)."""
    from elpis.bend.kernel import check_proof

    if key not in prog.proofs:
        return set()
    try:
        return set(check_proof(prog, key)["uses"])
    except BendError:
        return set()


def _with_dependencies(prog: Program, keys: list[str]) -> list[str]:
    """Add every law the selected proofs cite, transitively: a proof is only as good as its lemmas."""
    todo, seen = list(keys), set(keys)
    while todo:
        for dep in sorted(_cited(prog, todo.pop())):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return [k for k in _law_keys(prog, None) if k in seen]


def _check_citations(prog: Program, results: list[dict]) -> None:
    """Fail a kernel-proved law whose proof cites a law that fails, or that cites in a cycle."""
    by_key = {r["key"]: r for r in results}
    uses = {
        r["key"]: set(r["certificate"]["uses"])
        for r in results
        if r["ok"] and r["certificate"] and r["certificate"].get("method") == "kernel"
    }
    for key, deps in uses.items():  # cycles: a law may not (indirectly) rest on itself
        stack, seen = [(d, [key, d]) for d in deps], set()
        while stack:
            node, path = stack.pop()
            if node == key:
                r = by_key[key]
                cycle = " -> ".join(prog.laws[k].name for k in path)
                r.update(ok=False, message=f"{r['location']}: law {r['name']}: circular proof: {cycle}")
                break
            if node in seen:
                continue
            seen.add(node)
            stack.extend((d, [*path, d]) for d in uses.get(node, ()))
    changed = True
    while changed:  # a law whose lemmas fail fails too
        changed = False
        for key, deps in uses.items():
            r = by_key[key]
            if not r["ok"]:
                continue
            bad = sorted(d for d in deps if d not in by_key or not by_key[d]["ok"])
            if bad:
                names = ", ".join(prog.laws[d].name for d in bad)
                reason = f"its proof cites {names}, which does not check"
                law = prog.laws[key]
                r.update(
                    ok=False,
                    message=_explain_kernel_failure(
                        prog, law, BendError(f"{law.loc}: law {law.name}: {reason}")
                    ),
                )
                changed = True


def _balance(keys: list[str], jobs: int) -> list[list[str]]:
    """Round-robin the laws over `jobs` batches (laws of one module have similar cost)."""
    batches: list[list[str]] = [[] for _ in range(max(1, jobs))]
    for i, key in enumerate(keys):
        batches[i % len(batches)].append(key)
    return [b for b in batches if b]


def sources_digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.as_posix().encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()
