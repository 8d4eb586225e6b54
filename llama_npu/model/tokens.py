"""Llama 3.2's special token ids and the label id the loss ignores: a leaf, so the data
modules need not import the model to know them."""
BOS_ID = 128000  # <|begin_of_text|>
EOT_ID = 128009  # <|eot_id|>
PAD_ID = 128004  # <|finetune_right_pad_id|>: never a target, masked out of the loss
IGNORE_ID = -100
