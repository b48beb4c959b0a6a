"""The tests here reuse the helpers and the closed forms of the tests one folder up."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
