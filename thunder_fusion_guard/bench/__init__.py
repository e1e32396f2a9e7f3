"""The benchmark harness: the cases, interleaved timing of their variants, decision accuracy, side-by-side
profiles and where a run happened. ``fusion-guard bench`` (:mod:`..tools.bench_cli`) is its command line."""
