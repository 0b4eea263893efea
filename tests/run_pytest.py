#!/usr/bin/env python3
"""Runs the Python package's pytest suite for ctest:

    python3 tests/run_pytest.py PYTHON_DIR [pytest arguments...]

Exit 77 (skipped) when numpy or pytest is missing, unless
CLATTN_REQUIRE_BACKENDS names "python"; a run that collects no test fails
(pytest's exit 5), so a filter that matches nothing cannot pass."""
import os
import sys

required = "python" in os.environ.get("CLATTN_REQUIRE_BACKENDS", "").split(",")
try:
    import numpy  # noqa: F401
    import pytest
except ImportError as e:
    print(("FAIL (required): " if required else "SKIP: ") + str(e))
    sys.exit(1 if required else 77)

here = sys.argv[1]
sys.path.insert(0, here)
code = pytest.main(["-p", "no:cacheprovider", "-q", "-rs", "--rootdir", here] + sys.argv[2:])
sys.exit(1 if code == 5 else int(code))
