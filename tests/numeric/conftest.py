"""Fixtures shared by the numeric suite's test modules."""

from __future__ import annotations

import pytest

import qviz
from tests.helpers.lineage_models import models


@pytest.fixture(scope="session")
def lowered():
    """The lineage models' converted model, lowered to onnxruntime once for every module."""
    pytest.importorskip("onnxruntime")
    m = models()
    return qviz.lower(m.converted, (m.data[0],), backend="onnxruntime")
