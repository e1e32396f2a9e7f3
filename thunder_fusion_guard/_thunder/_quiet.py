"""Thunder imported quietly (``thunder_fusion_guard._quiet`` says how), before anything else of this package
touches it. Imported first by ``_thunder/__init__.py``."""

from __future__ import annotations

from .._quiet import import_quietly

import_quietly()
