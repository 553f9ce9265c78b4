"""The Spark jobs' pure parts, without a SparkSession."""
from spark import restore


def test_topics_are_dealt_into_partitions_of_about_equal_rows():
    assert restore.balance({"a": 10, "b": 5, "c": 5, "d": 1}, 2) == [["a", "d"], ["b", "c"]]
    assert restore.balance({"a": 1}, 8) == [["a"]]
    assert restore.balance({}, 4) == []
