"""``torch_npu`` for the analysis child process in tests: puts the torch_npu double in its place.

The npu backend runs torch_npu's analysis in a child process; ``install`` points that child's
``PYTHONPATH`` here, so the child's ``import torch_npu`` gets the same double as the test.
"""

import os

import pytest
from backends.doubles import torch_npu as _double

_double.install(pytest.MonkeyPatch())
_double.STATE.fail_analyse = os.environ.get("PROFCTX_TEST_NPU_FAIL_ANALYSE") or None
