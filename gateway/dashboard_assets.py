"""The dashboard's page and assets: served by gateway/api/routes_dashboard.py, and without a key
(gateway/security/auth.py), since they are the same files for everyone and hold no data."""

from __future__ import annotations

from pathlib import Path
from typing import Final

STATIC_DIR: Final = Path(__file__).resolve().parent / "static"
# Served path -> (file in STATIC_DIR, media type); a fixed list, so no path ever reaches the disk.
ASSETS: Final = {
    "/dashboard": ("dashboard.html", "text/html; charset=utf-8"),
    "/dashboard/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
# Served without a key even when keys are configured (gateway/security/auth.py).
OPEN_PATHS: Final = frozenset(ASSETS)
