"""The order the admin, the dashboard, /metrics and run_scanners list the served namespaces in."""
from delayqueue.stores.tokens import ordered_namespaces


def test_delayqueue_namespace_first_then_the_others_sorted_each_once():
    assert ordered_namespaces("default", ["shop", "billing", "default", "shop"]) == ["default", "billing", "shop"]


def test_delayqueue_namespace_alone_when_no_token_names_another():
    assert ordered_namespaces("main", []) == ["main"]
