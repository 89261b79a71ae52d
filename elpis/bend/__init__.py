"""Our Bend subset: parser, checker, interpreter, prover (z3 + a small kernel) and C generator."""
