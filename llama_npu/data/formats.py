"""The input formats, one list: recipe validation (data.format), prepare-data's --format
and the readers (data/readers.py) all take these names. A leaf."""

FORMATS = ("alpaca", "sharegpt", "text")

# What a bad record does: prepare-data's --on-bad-record and a recipe's data.on_bad_record.
ON_BAD_RECORD = ("error", "skip")
