"""Command-line tools and the benchmark harness (``fusion-guard ...``); the library never imports them."""
