"""The input formats, one list: recipe validation (data.format), prepare-data's --format
and the readers (data/readers.py) all take these names. A leaf."""

FORMATS = ("alpaca", "sharegpt", "text")
