"""Quality gates: evidence, decided by rules written before the data is seen.

- `elpis.gate.metrics`: per-position KL / top-1 / NLL and relative error against fp64.
- `elpis.gate.ops`: the registry of patchable ops and the per-op error harness (`elpis gate op`).
- `elpis.gate.configs` and `elpis.gate.compare`: teacher-forced model comparison (`elpis gate model`).
- `elpis.gate.rules`, `elpis.gate.bootstrap`, `elpis.gate.verdicts`: pre-registered rules, the paired
  block bootstrap and PASS / FAIL / UNRESOLVED verdicts (`elpis gate verdict`).
- `elpis.gate.eval`: AIME 2025 / GSM8K lanes against any OpenAI-compatible server (`elpis eval`).

See `elpis/gate/README.md` for the rules in plain words.
"""
