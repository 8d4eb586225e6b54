"""How many int8 weights model/int8_linear.py's forward dequantizes at a time. A leaf without
MindSpore, so the planner (memory/int8_weights.py) counts the same block the model runs
without importing the model's cells."""
from __future__ import annotations

# Whole output channels at a time: 8 MB in fp32, where the 1B's MLP weight is 67 MB.
DEQUANT_BLOCK = 1 << 21
