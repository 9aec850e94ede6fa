"""The controller's pure checks: the operator's own ceiling on replicas."""

from __future__ import annotations

import pytest

from specdecode import api
from specdecode.controller import check_replicas

from ..spec_corpus import spec_with


def test_replicas_above_the_operator_limit_name_the_setting():
    check_replicas(api.parse_spec(spec_with({"replicas": 32})), 32)
    with pytest.raises(api.SpecError, match=r"spec.replicas: 33 is above this operator's limit of 32.*SPECDECODE_MAX_REPLICAS"):
        check_replicas(api.parse_spec(spec_with({"replicas": 33})), 32)
    check_replicas(api.parse_spec(spec_with({"replicas": 200})), None)
