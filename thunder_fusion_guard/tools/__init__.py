"""The command line (``fusion-guard ...``); the library never imports it. The benchmark harness it runs lives
in :mod:`..bench`."""
