"""launcher/core/podfit.py: quantities as the official client parses them, pod requests, tolerations."""

import pytest

from launcher.core.podfit import pod_requests, quantity, tolerates


@pytest.mark.parametrize(
    "text,value",
    [
        ("500m", 0.5),
        ("8Gi", 8 * 2.0**30),
        ("1e3", 1000.0),
        ("1P", 1e15),
        ("2E", 2e18),
        ("1Ei", 2.0**60),
        (4, 4.0),
    ],
)
def test_a_quantity_in_every_form_the_api_server_accepts(text, value) -> None:
    assert quantity(text) == value


@pytest.mark.parametrize("text", ["1.2.3", "NaN", "Infinity", "5ki", "", True, None])
def test_what_is_not_a_quantity_is_a_value_error(text) -> None:
    with pytest.raises(ValueError, match=r"quantity|Invalid|suffix"):
        quantity(text)


def test_requests_default_to_limits_and_add_up_over_containers() -> None:
    pod = {
        "spec": {
            "containers": [
                {"resources": {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "500m"}}},
                {"resources": {"requests": {"cpu": "1e3", "google.com/tpu": 4}}},
            ]
        }
    }
    assert pod_requests(pod) == {"cpu": 1000.5, "memory": 2.0**30, "google.com/tpu": 4.0}


@pytest.mark.parametrize(
    "toleration,tolerated",
    [
        ({"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}, True),
        ({"key": "google.com/tpu", "value": "other"}, False),
        ({"key": "google.com/tpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"operator": "Exists"}, True),  # an empty key with Exists tolerates everything
        ({"value": "present"}, False),  # an empty key with Equal tolerates nothing
    ],
)
def test_tolerations_as_corev1_toleratestaint(toleration, tolerated) -> None:
    taint = {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}
    assert tolerates([toleration], taint) is tolerated
