"""The values a KTO label cell may hold, by side, before a recipe's data.label_values add to
them: JSON booleans' texts, 1/0, yes/no and the thumbs (objectives/kto/records.py reads labels
by them; recipe/data_sources.py checks a recipe's map against them)."""
LABEL_VALUES = {"desirable": ("true", "1", "yes", "\U0001F44D"), "undesirable": ("false", "0", "no", "\U0001F44E")}
